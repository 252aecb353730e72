"""``merge_env_rows``: one env's Table-1 rows from a workspace's table1.json into the
project's, the other envs' rows and their provenance kept."""

from __future__ import annotations

import copy

from components.agent.table1 import markdown, merge_env_rows
from tests.factories import TABLE1_CLONE, TABLE1_PROJECT, run_provenance, table1_row

PROJECT, WORKSPACE = TABLE1_PROJECT, TABLE1_CLONE
_row, _prov = table1_row, run_provenance


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
