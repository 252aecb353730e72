"""``merge_env_rows``: one env's Table-1 rows from a workspace's table1.json into the
project's, the other envs' rows and their provenance kept."""

from __future__ import annotations

import copy

from components.agent.table1 import markdown, merge_env_rows


def _row(success: float) -> dict:
    return {
        "success": success,
        "ci_low": success - 0.1,
        "ci_high": success + 0.1,
        "episodes": 8,
        "tasks": 4,
        "seeds": 2,
        "real_steps": None,
    }


def _prov(env: str, commit: str) -> dict:
    return {"env": env, "git_commit": commit, "dirty": False, "profile": "ci"}


PROJECT = {
    "_headline": "sampled",
    "_provenance": _prov("textworld", "aaa"),
    "_provenance_by_env": {
        "textworld": _prov("textworld", "aaa"),
        "scienceworld": _prov("scienceworld", "old"),
    },
    "textworld": {"sft": _row(0.4), "dpo": None},
    "scienceworld": {"sft": _row(0.1), "dpo": _row(0.2)},
}
# a workspace's file: its env's fresh rows beside the (stale) committed rows of the others
WORKSPACE = {
    "_headline": "sampled",
    "_provenance": _prov("scienceworld", "new"),
    "_provenance_by_env": {"scienceworld": _prov("scienceworld", "new")},
    "scienceworld": {"sft": _row(0.3), "dpo": None},
    "textworld": {"sft": _row(0.9), "dpo": _row(0.9)},  # stale: must not reach the project
    "miniwob": {"sft": _row(0.5)},
}


def test_the_envs_rows_are_replaced_and_the_others_kept():
    project, workspace = copy.deepcopy(PROJECT), copy.deepcopy(WORKSPACE)
    merged = merge_env_rows(project, workspace, "scienceworld")
    assert merged["scienceworld"] == WORKSPACE["scienceworld"]  # replaced wholesale
    assert merged["textworld"] == PROJECT["textworld"]  # the project's, not the workspace's
    assert "miniwob" not in merged  # only this env comes from the workspace
    assert merged["_provenance_by_env"] == {
        "textworld": _prov("textworld", "aaa"),
        "scienceworld": _prov("scienceworld", "new"),
    }
    assert merged["_provenance"] == _prov("scienceworld", "new")  # the latest run's
    assert merged["_headline"] == "sampled"
    assert (project, workspace) == (PROJECT, WORKSPACE)  # inputs not mutated
    text = markdown(merged)
    assert "### scienceworld" in text and "### textworld" in text and "30.0 (20.0-40.0)" in text


def test_a_new_env_and_an_empty_project():
    merged = merge_env_rows(PROJECT, WORKSPACE, "miniwob")
    assert merged["miniwob"] == WORKSPACE["miniwob"]
    assert merged["scienceworld"] == PROJECT["scienceworld"]
    assert set(merged["_provenance_by_env"]) == {"textworld", "scienceworld", "miniwob"}
    first = merge_env_rows({}, WORKSPACE, "scienceworld")
    assert {k for k in first if not k.startswith("_")} == {"scienceworld"}
    assert first["_provenance_by_env"] == {"scienceworld": _prov("scienceworld", "new")}


def test_no_rows_for_the_env_leaves_the_project_unchanged():
    for workspace in ({}, {"_provenance": _prov("x", "y")}, {"scienceworld": None}):
        assert merge_env_rows(PROJECT, workspace, "scienceworld") == PROJECT
    assert merge_env_rows(PROJECT, WORKSPACE, "nethack") == PROJECT
