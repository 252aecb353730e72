"""The README's results table is the committed metrics: a rerun that moves a number
fails here until the README says the new one (it went stale before, unnoticed)."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ENVS = {"TextWorld": "textworld", "ScienceWorld": "scienceworld", "MiniWoB++": "miniwob"}


def _pct(x: float) -> str:
    return f"{100 * x + 0.0:.1f}"  # + 0.0: never "-0.0"


def _signed(x: float) -> str:
    return f"{100 * x + 0.0:+.1f}"


def _steps(row: dict) -> str:
    return f"[{round(row['real_steps']):,}]"


def _expected(rows: dict) -> list[str]:
    """The five cells after the env's name, as the README writes them."""
    sft, dream, vs = rows["sft"], rows["dreamgym_grpo"], rows["dreamgym_grpo"]["vs_sft"]
    return [
        _pct(rows["random"]["success"]),
        f"{_pct(sft['success'])} ({_pct(sft['ci_low'])}-{_pct(sft['ci_high'])})",
        f"{_pct(rows['grpo_real']['success'])} {_steps(rows['grpo_real'])}",
        f"**{_pct(dream['success'])}** ({_signed(vs['diff'])}; "
        f"{_signed(vs['ci_low'])}, {_signed(vs['ci_high'])})",
        f"**{_pct(rows['s2r_grpo']['success'])}** {_steps(rows['s2r_grpo'])}",
    ]


def test_results_at_a_glance_are_the_committed_metrics():
    table = json.loads((ROOT / "metrics" / "table1.json").read_text(encoding="utf-8"))
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    glance = readme.split("## Results at a glance", 1)[1].split("\n## ", 1)[0]
    seen = {}
    for line in (row for row in glance.splitlines() if row.startswith("|")):
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        name = re.sub(r" \(.*", "", cells[0])
        if name in ENVS:
            seen[name] = cells[1:]
    assert set(seen) == set(ENVS), f"README rows: {sorted(seen)}"
    for name, cells in seen.items():
        assert cells == _expected(table[ENVS[name]]), name
