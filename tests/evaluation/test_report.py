"""The pipeline report: renders what exists, says "not run" for the rest, invents nothing."""

from __future__ import annotations

import json
import re
from pathlib import Path

from components.config import ReportConfig
from components.evaluation.report import METRIC_FILES, NOT_RUN, PLOTS, build_report
from components.evaluation.theorem1 import IterationTerms, write_theorem1

CFG = ReportConfig(dpi=40, paper_reference=False)
PNG = b"\x89PNG\r\n\x1a\n"


def write(path: Path, data: object) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data), encoding="utf-8")


def test_empty_metrics_dir_marks_every_input_not_run(tmp_path):
    res = build_report(tmp_path / "metrics", tmp_path / "reports", CFG)
    text = res.markdown.read_text()
    assert res.markdown == tmp_path / "reports" / "report.md"
    assert res.plots == [] and set(res.inputs) == {*METRIC_FILES, "history/*.jsonl"}
    # every plot the DVC stage lists is written, as a placeholder that is not linked
    assert [x.name for x in res.placeholders] == list(PLOTS)
    assert all(x.read_bytes()[:8] == PNG and f"]({x.name})" not in text for x in res.placeholders)
    assert all(v == NOT_RUN for v in res.inputs.values())
    for name in ("table1.json", "fidelity.json", "judge.json", "drift.json", "theorem1.json"):
        assert f"_{name}: not run._" in text
    # no number was invented: no percentages, no decimals anywhere
    assert not re.search(r"\d+\.\d+", text) and "%" not in text.replace("success %", "")


def test_full_metrics_render_tables_and_plots(tmp_path):
    m = tmp_path / "metrics"
    write(
        m / "data.json",
        {
            "n_trajectories": 1060,
            "n_transitions": 14714,
            "n_games": {"train": 43, "test": 7},
            "success_rate": {"expert": 1.0},
        },
    )
    write(m / "buffer.json", {"rows": 11703, "rows_real": 11703, "rows_synthetic": 0})
    write(
        m / "table1.json",
        {
            "textworld": {
                "sft": {
                    "success": 0.25,
                    "ci_low": 0.1,
                    "ci_high": 0.4,
                    "episodes": 40,
                    "seeds": 2,
                    "real_steps": 0,
                },
                "dreamgym_grpo": {
                    "success": 0.4,
                    "ci_low": 0.25,
                    "ci_high": 0.55,
                    "episodes": 40,
                    "seeds": 2,
                    "real_steps": 0,
                },
                "dreamgym_grpo_no_replay": {
                    "success": 0.3,
                    "ci_low": 0.2,
                    "ci_high": 0.45,
                    "episodes": 40,
                    "seeds": 2,
                    "real_steps": 0,
                },
            }
        },
    )
    write(
        m / "fidelity.json",
        {
            "full": {
                "n": 100,
                "eps_R": 0.05,
                "eps_R_ci95_low": 0.02,
                "eps_R_ci95_high": 0.11,
                "state_exact_match": 0.3,
                "state_token_f1": 0.8,
                "malformed_rate": 0.01,
                "majority_baseline_reward_accuracy": 0.94,
                "success_f1": 0.7,
                "always_win_baseline_success_f1": 0.11,
                "copy_baseline_state_exact_match": 0.2,
            },
            "no_replay": {"n": 100, "eps_R": 0.09, "state_token_f1": 0.7, "malformed_rate": 0.02},
            "_provenance": {"env": "textworld", "profile": "ci"},  # not a variant row
        },
    )
    write(
        m / "judge.json",
        {
            "full": {
                "consistency": 1.8,
                "diversity": 1.5,
                "informativeness": 1.7,
                "hallucination": 1.9,
                "n": 100,
            },
            "no_replay": {
                "consistency": 1.1,
                "diversity": 1.4,
                "informativeness": 1.2,
                "hallucination": 1.3,
                "n": 100,
            },
        },
    )
    write(
        m / "drift.json",
        {
            "iter_0": {"drift_share": 0.1, "drifted": False},
            "iter_1": {"drift_share": 0.6, "drifted": True},
        },
    )
    write_theorem1([IterationTerms(0, 0.1, 0.001, 0.05, 0.2, horizon=4, real_gain=0.05)], m)
    (m / "annotate.json").write_text("{not json")

    res = build_report(m, tmp_path / "reports", CFG, drift_threshold=0.5)
    text = res.markdown.read_text()
    names = sorted(p.name for p in res.plots)
    assert names == [
        "drift.png",
        "fidelity.png",
        "judge.png",
        "success.png",
        "theorem1.png",
    ]
    assert [x.name for x in res.placeholders] == ["rl_curves.png"]  # no history: not run
    assert all(p.read_bytes()[:8] == PNG and p.parent == res.markdown.parent for p in res.plots)
    assert "| DreamGym GRPO | 40.0 | [25.0, 55.0] | n/a |  |  |  |  | 40 | 2 | 0 |" in text
    assert "| SFT | 25.0 | [10.0, 40.0] |" in text
    assert "| w/o replay | 30.0 | 0.090 | 0.700 | 1.10 | 1.30 |" in text  # ablation row
    assert "| DreamGym GRPO w/o replay | 30.0 |" in text
    assert "_provenance" not in text
    # each fidelity figure beside its trivial baseline (majority eps_R .06, always-win F1)
    assert (
        "| DreamGym (full) | 100 | 0.050 | [0.020, 0.110] | 0.060 | 0.700 | 0.110 | 0.300 | 0.200 |"
        in text
    )
    assert "| DreamGym (full) | 100 | 1.80 | 1.50 | 1.70 | 1.90 |" in text  # judge row
    assert "**Drift flagged** in iter_1." in text
    assert "1,060 trajectories" in text
    assert res.inputs["annotate.json"].startswith("unreadable")
    assert res.inputs["experience.json"] == NOT_RUN and "experience.json: not run" in text
    for p in res.plots:
        assert f"]({p.name})" in text  # every plot is linked next to its table


def test_older_flat_fidelity_file_and_paper_reference(tmp_path):
    m = tmp_path / "metrics"
    write(m / "fidelity.json", {"n": 100, "eps_R": 1.0, "malformed_rate": 1.0})
    res = build_report(m, tmp_path / "r", ReportConfig(dpi=40, paper_reference=True))
    text = res.markdown.read_text()
    assert "| DreamGym (full) | 100 | 1.000 |" in text
    assert "| WebShop | 32.0/35.1/32.9 |" in text and "not measured here" in text


def test_table1_as_the_stage_writes_it_with_paper_column_curves_and_run_drift(tmp_path):
    m = tmp_path / "metrics"
    row = {"success": 0.25, "ci_low": 0.1, "ci_high": 0.4, "episodes": 40, "seeds": 1}
    # components/agent/table1.py: every method present, None when not evaluated
    write(
        m / "table1.json",
        {"textworld": {"sft": {**row, "real_steps": 0}, "ppo_real": None, "s2r_grpo": None}},
    )
    rounds = [
        {"iteration": 1, "success_rate": 0.2, "real_steps": 120, "rollout_seconds": 30},
        {"iteration": 2, "success_rate": 0.4, "real_steps": 250, "rollout_seconds": 30},
    ]
    (m / "history").mkdir(parents=True)
    (m / "history" / "grpo_real.jsonl").write_text(
        "\n".join(json.dumps(r) for r in rounds) + "\n{torn"
    )
    synthetic = [{"iteration": i, "success_rate": 0.5, "real_steps": 0} for i in (1, 2, 3, 4)]
    (m / "history" / "dreamgym_grpo.jsonl").write_text("\n".join(json.dumps(r) for r in synthetic))
    # the drift stage: one group per synthetic run, then per iteration
    write(
        m / "drift.json",
        {
            "dreamgym_ppo": {
                "drifted": True,
                "iter_1": {"drift_share": 0.7, "drifted": True},
                "iter_0": {"drift_share": 0.2, "drifted": False},
            }
        },
    )
    res = build_report(m, tmp_path / "r", ReportConfig(dpi=40, paper_reference=True))
    text = res.markdown.read_text()
    assert "| SFT | 25.0 | [10.0, 40.0] | n/a |  |  |  |  | 40 | 1 | 0 | 61.7/68.0/71.8 |" in text
    assert "PPO (real env)" not in text.split("## RL training curves")[0]  # not evaluated
    assert "| GRPO (real env) | 2 | 0.20 | 0.30 | 250 | 1.0 |" in text
    assert "| DreamGym GRPO | 4 | 0.50 | 0.50 | 0 | 0.0 |" in text
    assert res.inputs["history/grpo_real.jsonl"] == "ok (2 rounds), 1 bad lines"
    assert text.index("| dreamgym_ppo iter_0 |") < text.index("| dreamgym_ppo iter_1 |")
    assert "**Drift flagged** in dreamgym_ppo iter_1." in text
    assert {x.name for x in res.plots} == {"success.png", "rl_curves.png", "drift.png"}
    assert {x.name for x in res.placeholders} == {"fidelity.png", "judge.png", "theorem1.png"}


def test_theorem1_section_renders_each_dreamgym_run(tmp_path):
    from components.evaluation.theorem1 import FORMULA, summarize

    m = tmp_path / "metrics"
    grpo = [IterationTerms(1, 0.1, 0.001, 0.05, 0.2, horizon=4, real_gain=0.0)]
    ppo = [IterationTerms(k, -0.05, 0.002, 0.1, 0.3, horizon=5) for k in (1, 2)]
    runs = {
        "dreamgym_grpo": {
            **summarize(grpo),
            "real_split": "validation",
            "real_episodes_per_policy": 9,
        },
        "dreamgym_ppo": summarize(ppo),
    }
    write(m / "theorem1.json", {"formula": FORMULA, "runs": runs})
    res = build_report(m, tmp_path / "reports", CFG)
    text = res.markdown.read_text()
    section = text[text.index("## Theorem 1") :]
    assert "**dreamgym_grpo** (real gains on 9 validation episodes per policy)" in section
    assert "the bound held in 1 of 1 updates" in section  # 0.0 >= 0.1 - penalties
    assert "**dreamgym_ppo**: the bound held in 0 of 0 updates" in section
    assert "theorem1.png" in {p.name for p in res.plots}


def test_theorem1_run_without_a_measured_update_is_said_not_hidden(tmp_path):
    m = tmp_path / "metrics"
    run = {"iterations": [], "rounds": 2, "real_split": "validation", "real_success": {"0": 0.0}}
    write(m / "theorem1.json", {"formula": "f", "runs": {"dreamgym_ppo": run}})
    text = build_report(m, tmp_path / "reports", CFG).markdown.read_text()
    section = text[text.index("## Theorem 1") :]
    assert "**dreamgym_ppo**: 2 rounds, no update measured" in section
    assert "Real validation success of dreamgym_ppo: pi_0 0" in section


def test_curves_average_the_seeds_of_each_round():
    from components.evaluation.report import _mean_over_seeds

    rows = [
        {"iteration": 1, "seed": 0, "success_rate": 0.2},
        {"iteration": 2, "seed": 0, "success_rate": 0.4},
        {"iteration": 1, "seed": 1, "success_rate": 0.6},
        {"iteration": 2, "seed": 1, "success_rate": 0.8},
    ]
    out = _mean_over_seeds(rows)
    assert [r["iteration"] for r in out] == [1.0, 2.0] and [r["seeds"] for r in out] == [2, 2]
    assert [round(r["success_rate"], 6) for r in out] == [0.4, 0.6]


def test_ablation_success_is_the_run_envs_not_another_envs_archived_row(tmp_path):
    # table1.json keeps other envs' archived rows: a ScienceWorld run's ablation table
    # must not show TextWorld's DreamGym success beside ScienceWorld's fidelity
    m = tmp_path / "metrics"
    row = {"success": 97.0, "n": 10}
    write(
        m / "table1.json",
        {
            "textworld": {"dreamgym_grpo": row},
            "scienceworld": {"dreamgym_grpo": {**row, "success": 44.2}},
            "_provenance": {"git_commit": "abc", "dirty": False, "profile": "cpu"},
        },
    )

    def ablation(env):
        text = build_report(m, tmp_path / f"r-{env}", CFG, env=env).markdown.read_text()
        return text[text.index("## Ablations") :].split("\n## ")[0]

    assert "| DreamGym (full) | 44.2 |" in ablation("scienceworld")
    assert "| DreamGym (full) | 97.0 |" in ablation("textworld")
    assert "97.0" not in ablation(None) and "44.2" not in ablation(None)  # which env: unknown
