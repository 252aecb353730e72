"""RL training checkpoints: resume after a kill at the last completed round.

A checkpoint is a directory ``ckpt-<iteration>/state.pt`` holding the trainable policy
weights (all of them, or only the LoRA adapters), the learner's state (optimizer, value
head), the round counter, the real-step count, the metric history and the RNG states.
It is written under a temporary name and renamed, so a kill mid-write leaves either the
previous checkpoint or the new one, never a torn one. A fingerprint of the run (config
minus runtime-only fields, plus what the caller adds, e.g. the start model) is stamped in
the directory: checkpoints of a different run are wiped instead of resumed.
Loading uses ``torch.load(weights_only=True)``: everything stored is tensors and plain data.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
from pathlib import Path
from typing import Any

log = logging.getLogger(__name__)

PREFIX = "ckpt-"
STATE_FILE = "state.pt"
FINGERPRINT_FILE = "fingerprint.json"
_NAME = re.compile(rf"^{PREFIX}(\d+)$")


def same_run(ckpt_dir: Path, fingerprint: dict[str, Any]) -> bool:
    """True if ``ckpt_dir`` is stamped with ``fingerprint`` (its checkpoints are this
    run's); else another run's checkpoints are wiped and the folder stamped for this one."""
    blob = json.dumps(fingerprint, sort_keys=True, default=str)
    stamp = ckpt_dir / FINGERPRINT_FILE
    if stamp.exists() and stamp.read_text(encoding="utf-8") == blob:
        return True
    if ckpt_dir.exists():
        log.info("checkpoints in %s belong to another run: starting over", ckpt_dir)
        shutil.rmtree(ckpt_dir)
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    stamp.write_text(blob, encoding="utf-8")
    return False


def prepare(ckpt_dir: Path, fingerprint: dict[str, Any]) -> Path | None:
    """The newest checkpoint of this run (None if none); another run's are wiped."""
    return latest(ckpt_dir) if same_run(ckpt_dir, fingerprint) else None


def latest(ckpt_dir: Path) -> Path | None:
    """The complete checkpoint with the highest round number."""
    if not ckpt_dir.exists():
        return None
    found = [
        (int(m.group(1)), p)
        for p in ckpt_dir.iterdir()
        if (m := _NAME.match(p.name)) and (p / STATE_FILE).is_file()
    ]
    return max(found)[1] if found else None


def save(ckpt_dir: Path, iteration: int, state: dict[str, Any], keep: int = 2) -> Path:
    """Write ``state`` atomically as ``ckpt-<iteration>``; keep the newest ``keep``."""
    import torch

    final = ckpt_dir / f"{PREFIX}{iteration}"
    tmp = ckpt_dir / f".tmp-{PREFIX}{iteration}"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    torch.save(state, tmp / STATE_FILE)
    shutil.rmtree(final, ignore_errors=True)
    os.replace(tmp, final)
    done = sorted((int(m.group(1)), p) for p in ckpt_dir.iterdir() if (m := _NAME.match(p.name)))
    for _, old in done[: max(0, len(done) - keep)]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def load(path: Path) -> dict[str, Any]:
    """The state saved in a checkpoint directory (tensors on CPU)."""
    import torch

    return torch.load(path / STATE_FILE, map_location="cpu", weights_only=True)


def trainable_state(model: Any) -> dict[str, Any]:
    """The trainable parameters of ``model`` (cloned to CPU)."""
    return {
        name: p.detach().to("cpu").clone()
        for name, p in model.named_parameters()
        if p.requires_grad
    }


def load_trainable_state(model: Any, state: dict[str, Any]) -> None:
    """Copy saved trainable parameters back; every trainable one must be present."""
    import torch

    params = dict(model.named_parameters())
    missing = [n for n, p in params.items() if p.requires_grad and n not in state]
    unknown = [n for n in state if n not in params]
    if missing or unknown:
        raise ValueError(
            f"checkpoint does not match the model: missing {missing[:3]}, unknown {unknown[:3]}"
        )
    with torch.no_grad():
        for name, value in state.items():
            params[name].copy_(value.to(params[name].device))


def rng_state() -> dict[str, Any]:
    """Python and torch (CPU, CUDA) RNG states as plain data and tensors."""
    import torch

    version, internal, gauss = random.getstate()
    state: dict[str, Any] = {
        "python": [version, list(internal), gauss],
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    """Restore what ``rng_state`` captured."""
    import torch

    version, internal, gauss = state["python"]
    random.setstate((version, tuple(internal), gauss))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])
