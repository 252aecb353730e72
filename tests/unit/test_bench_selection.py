"""The selection-suite tool: overrides, paired comparison, its refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.selection import main, overridden, paired


@pytest.fixture(scope="module")
def cfg():
    from components.config import load_config

    return load_config(Path("params.yaml"))


def test_overrides_reach_nested_settings_and_leave_the_rest(cfg) -> None:
    out = overridden(cfg, ["rl.s2r_dream_iterations=144", "rl.grpo.temperature=0.5"])
    assert out.rl.s2r_dream_iterations == 144 and out.rl.grpo.temperature == 0.5
    assert out.rl.ppo == cfg.rl.ppo and out.agent == cfg.agent
    assert cfg.rl.s2r_dream_iterations != 144  # the loaded config is untouched


@pytest.mark.parametrize(
    ("item", "says"),
    [
        ("s2r_explore=true", "expected section.key=value"),
        ("rl.no_such_key=1", "has no setting 'no_such_key'"),
        ("nope.key=1", "no section 'nope'"),
        ("rl.s2r_dream_iterations=-3", "greater than or equal to 1"),
    ],
)
def test_a_bad_override_is_a_one_line_error(cfg, item: str, says: str) -> None:
    with pytest.raises(SystemExit) as err:
        overridden(cfg, [item])
    assert says in str(err.value) and "\n" not in str(err.value)


def test_paired_difference_is_over_shared_games_and_seeds_with_a_ci() -> None:
    a = {"g1": {0: 1.0, 1: 1.0}, "g2": {0: 0.0, 1: 1.0}, "g3": {0: 1.0}, "only_a": {0: 1.0}}
    b = {"g1": {0: 1.0, 1: 0.0}, "g2": {0: 0.0, 1: 0.0}, "g3": {0: 1.0, 1: 0.0}}
    res = paired(a, b)
    # cells (g1,0) 0, (g1,1) 1, (g2,0) 0, (g2,1) 1, (g3,0) 0: g3's seed 1 has no partner
    assert res["games"] == 3 and res["diff"] == pytest.approx(2 / 5)
    assert 0.0 <= res["ci_low"] <= res["diff"] <= res["ci_high"] <= 1.0
    with pytest.raises(SystemExit, match="share no"):
        paired({"g1": {0: 1.0}}, {"g1": {1: 1.0}})


def test_compare_needs_both_results(tmp_path: Path) -> None:
    with pytest.raises(SystemExit, match="no results at"):
        main(["--suite", str(tmp_path), "compare", "x", "y"])


def test_the_suite_never_reuses_the_projects_generator_seed(cfg, tmp_path: Path) -> None:
    from bench.selection import generate

    with pytest.raises(SystemExit, match="project's own generator seed"):
        generate(cfg, Path.cwd(), tmp_path, cfg.seed, {"quest": 1})


def test_show_lists_the_latest_evaluation_per_name_best_first(tmp_path: Path, capsys) -> None:
    import json

    rows = [
        {"name": "a", "method": "a", "success": 0.5, "per_seed": {"0": 0.5}, "episodes": 9},
        {"name": "b", "method": "b", "success": 0.7, "per_seed": {"0": 0.7}, "episodes": 9},
        {"name": "a", "method": "a", "success": 0.9, "per_seed": {"0": 0.9}, "episodes": 9},
    ]
    (tmp_path / "results.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    main(["--suite", str(tmp_path), "show"])
    body = capsys.readouterr().out.splitlines()[2:]
    assert [line.split(" | ")[0] for line in body] == ["| a", "| b"]  # a's rerun: 90.0
    assert "90.0" in body[0]
