"""components.buffer loads LanceDB only for the names that need it (PEP 562 exports)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import components.buffer as buffer

ROOT = Path(__file__).resolve().parents[2]


def test_every_public_name_resolves_to_its_submodule():
    assert sorted(buffer.__all__) == sorted(buffer._EXPORTS) and set(buffer.__all__) <= set(
        dir(buffer)
    )
    for name, module in buffer._EXPORTS.items():
        value = getattr(buffer, name)
        assert value is getattr(sys.modules[f"components.buffer.{module}"], name), name
    with pytest.raises(AttributeError, match="no attribute 'ReplayBufer'"):
        buffer.ReplayBufer  # noqa: B018


def test_a_policy_that_only_embeds_text_does_not_import_lancedb():
    # the scorer policy embeds with components.buffer.embedders: 8 evaluation stages of the
    # pipeline spent ~3 s each importing LanceDB and pyarrow for nothing
    code = (
        "import sys; import components.buffer.embedders, components.agent.scorer; "
        "from components.buffer import make_embedder, BufferVersionError; "
        "print(sorted(m for m in ('lancedb', 'pyarrow') if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-P", "-c", code],
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": ""},
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
