"""`dvc plots show` renders the report's image plots offline (issue 23, item 2)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def _image_plots() -> list[str]:
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    return [p for p in dvc.get("plots", []) if isinstance(p, str) and p.endswith(".png")]


def test_the_report_pngs_are_declared_as_top_level_plots():
    dvc = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    report_outs = {
        o if isinstance(o, str) else next(iter(o)) for o in dvc["stages"]["report"]["outs"]
    }
    images = _image_plots()
    assert images and set(images) <= report_outs  # only what the report stage writes


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_dvc_plots_show_writes_a_page_with_no_network_reference(tmp_path: Path):
    from PIL import Image

    shutil.copy(ROOT / "dvc.yaml", tmp_path / "dvc.yaml")
    shutil.copy(ROOT / "params.yaml", tmp_path / "params.yaml")
    images = _image_plots()
    for image in images:
        (tmp_path / image).parent.mkdir(parents=True, exist_ok=True)
        Image.new("RGB", (4, 4)).save(tmp_path / image)
    dvc = [str(Path(sys.executable).with_name("dvc"))]
    subprocess.run([*dvc, "init", "--no-scm", "-q"], cwd=tmp_path, check=True)
    subprocess.run(
        [*dvc, "plots", "show", "-o", "out", *images], cwd=tmp_path, check=True, capture_output=True
    )
    page = (tmp_path / "out" / "index.html").read_text(encoding="utf-8")
    assert "http://" not in page and "https://" not in page  # no CDN script: renders offline
    shown = set(re.findall(r'<img src="(static/[^"]+)"', page))
    assert len(shown) == len(images)
    assert len(list((tmp_path / "out" / "static").glob("*.png"))) == len(images)
