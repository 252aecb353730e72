"""``archive_env`` / ``dreamgym archive-env``: another checkout's run of one env into the
project: its files under reports/envs/<env>/, its entries merged into the side-by-side
metrics files, the other envs' entries and the project's own provenance kept."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest

from components.agent.table1 import markdown
from components.evaluation.env_archive import ARCHIVE_NOTE, archive_env, merge_env_entry
from tests.factories import TABLE1_CLONE, TABLE1_PROJECT, run_provenance, table1_row

PROJECT, SOURCE = TABLE1_PROJECT, TABLE1_CLONE
_row, _prov = table1_row, run_provenance


def test_the_envs_entry_is_replaced_and_the_project_keeps_its_own_top_level():
    project, source = copy.deepcopy(PROJECT), copy.deepcopy(SOURCE)
    merged = merge_env_entry(project, source, "scienceworld")
    assert merged["scienceworld"] == SOURCE["scienceworld"]  # replaced wholesale
    assert merged["textworld"] == PROJECT["textworld"]  # the project's, not the source's
    assert "miniwob" not in merged  # only this env comes from the source
    assert merged["_provenance_by_env"] == {
        "textworld": _prov("textworld", "aaa"),
        "scienceworld": _prov("scienceworld", "new"),
    }
    # the top level describes the project's own env (what science-check reads as fresh)
    assert merged["_provenance"] == _prov("textworld", "aaa")
    assert (project, source) == (PROJECT, SOURCE)  # inputs not mutated
    text = markdown(merged)
    assert "### scienceworld" in text and "### textworld" in text and "30.0 (20.0-40.0)" in text


def test_the_projects_own_env_or_an_empty_project_takes_the_sources_top_level():
    fresh = {**SOURCE, "_provenance": _prov("textworld", "new"), "_provenance_by_env": {}}
    merged = merge_env_entry(PROJECT, fresh, "textworld")
    assert merged["textworld"] == SOURCE["textworld"]
    assert merged["_provenance"] == merged["_provenance_by_env"]["textworld"]
    assert merged["_provenance"] == _prov("textworld", "new")
    first = merge_env_entry({}, SOURCE, "scienceworld")
    assert {k for k in first if not k.startswith("_")} == {"scienceworld"}
    assert first["_provenance"] == first["_provenance_by_env"]["scienceworld"]


def test_an_archived_env_keeps_the_label_of_how_its_intervals_were_made():
    from components.agent.table1 import CROSSED, TASKS_ONLY

    project = {**PROJECT, "_ci_by_env": {"textworld": CROSSED}}
    new_run = {**SOURCE, "_ci_by_env": {"scienceworld": CROSSED}}
    assert merge_env_entry(project, new_run, "scienceworld")["_ci_by_env"] == {
        "textworld": CROSSED,
        "scienceworld": CROSSED,
    }
    # a run made before the label resampled games only
    assert merge_env_entry(project, SOURCE, "scienceworld")["_ci_by_env"] == {
        "textworld": CROSSED,
        "scienceworld": TASKS_ONLY,
    }


def test_no_entry_for_the_env_leaves_the_project_unchanged():
    for source in ({}, {"_provenance": _prov("x", "y")}, {"scienceworld": None}):
        assert merge_env_entry(PROJECT, source, "scienceworld") == PROJECT
    assert merge_env_entry(PROJECT, SOURCE, "nethack") == PROJECT


def _write(path: Path, doc) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(doc if isinstance(doc, str) else json.dumps(doc))


def _fidelity(env: str, commit: str, dream: float) -> dict:
    side = {"success": dream, "episodes": 4}
    gap = {"diff": 0.1, "ci_low": 0.0, "ci_high": 0.2}
    fam = {"families": {}, "family_mae": 0.0, "family_mae_constant": 0.0, "gap": gap}
    doc = {"methods": {"sft": {"dream": side, "real": side, **fam}}, "gains": {}}
    return {env: doc, "_provenance": _prov(env, commit)}


@pytest.fixture
def clone_and_project(tmp_path: Path) -> tuple[Path, Path]:
    """A clone after a scienceworld run (one figure missing) and a project with a stale
    archive of that env (a file the new run does not have must go)."""
    clone, project = tmp_path / "clone", tmp_path / "project"
    _write(clone / "metrics" / "table1.json", SOURCE)
    _write(clone / "metrics" / "table1.md", "# the clone's table\n")
    _write(clone / "metrics" / "policy_fidelity.json", _fidelity("scienceworld", "new", 0.7))
    for name in ("data", "drift", "fidelity", "judge", "theorem1"):
        _write(clone / "metrics" / f"{name}.json", {"name": name})
    for method in ("sft", "dreamgym_grpo"):
        _write(clone / "metrics" / "agent" / f"{method}.json", {"method": method})
    _write(clone / "reports" / "report.md", "# report\n")
    for name in ("drift", "fidelity", "judge", "success", "theorem1"):  # no rl_curves.png
        (clone / "reports" / f"{name}.png").write_bytes(b"\x89PNG" + name.encode())
    _write(project / "metrics" / "table1.json", PROJECT)
    pf = _fidelity("textworld", "aaa", 0.9)
    _write(project / "metrics" / "policy_fidelity.json", pf)
    _write(project / "reports" / "envs" / "scienceworld" / "run.json", {"stale": True})
    return clone, project


def test_archive_env_copies_the_run_and_merges_its_entries(clone_and_project):
    clone, project = clone_and_project
    done = archive_env(clone, project, note="2 cores")
    folder = project / "reports" / "envs" / "scienceworld"
    assert done.env == "scienceworld" and done.folder == folder
    assert done.provenance == _prov("scienceworld", "new")
    assert done.missing == ["reports/rl_curves.png"]
    assert done.merged == ["metrics/table1.json", "metrics/policy_fidelity.json"]
    names = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file())
    assert "run.json" not in names  # the folder was replaced as a whole
    assert names == sorted([*done.copied, ARCHIVE_NOTE])
    assert {"agent/sft.json", "agent/dreamgym_grpo.json", "table1.json", "report.md"} <= set(names)
    assert (folder / "success.png").read_bytes() == b"\x89PNGsuccess"
    assert json.loads((folder / "table1.json").read_text()) == SOURCE  # as the run wrote it
    note = json.loads((folder / ARCHIVE_NOTE).read_text())
    assert note["source"] == str(clone.resolve()) and note["note"] == "2 cores"
    assert note["provenance"] == _prov("scienceworld", "new")
    assert note["missing"] == ["reports/rl_curves.png"]

    table = json.loads((project / "metrics" / "table1.json").read_text())
    assert table == merge_env_entry(PROJECT, SOURCE, "scienceworld")
    assert (project / "metrics" / "table1.md").read_text() == markdown(table)
    pf = json.loads((project / "metrics" / "policy_fidelity.json").read_text())
    assert set(pf) == {"_provenance", "_provenance_by_env", "scienceworld", "textworld"}
    assert pf["_provenance"] == _prov("textworld", "aaa")
    assert pf["scienceworld"]["methods"]["sft"]["dream"]["success"] == 0.7
    md = (project / "metrics" / "policy_fidelity.md").read_text()
    assert "### scienceworld" in md and "### textworld" in md
    leftovers = [p.name for p in project.rglob(".*")]
    assert leftovers == []  # no staged folder or temporary file left

    again = archive_env(clone, project, note="2 cores")  # idempotent
    assert again.copied == done.copied
    assert json.loads((project / "metrics" / "table1.json").read_text()) == table


def test_bad_sources_fail_with_one_line_and_write_nothing(clone_and_project):
    clone, project = clone_and_project
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}

    def unchanged() -> bool:
        return {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before

    with pytest.raises(ValueError, match="is this project"):
        archive_env(project, project)
    with pytest.raises(ValueError, match=r"table1\.json is missing: run the pipeline there"):
        archive_env(clone / "nowhere", project)
    with pytest.raises(ValueError, match="has no rows for env 'nethack'"):
        archive_env(clone, project, env="nethack")
    (clone / "metrics" / "drift.json").write_text("{half")
    with pytest.raises(ValueError, match=r"drift\.json: not valid JSON .*fix or delete it"):
        archive_env(clone, project)
    (clone / "metrics" / "drift.json").write_text("{}")
    (project / "metrics" / "table1.json").write_text("[1, 2]")
    before[project / "metrics" / "table1.json"] = b"[1, 2]"
    with pytest.raises(ValueError, match=r"table1\.json: not a JSON object"):
        archive_env(clone, project)
    assert unchanged()


def test_the_command_archives_and_reports_one_line_errors(clone_and_project):
    from typer.testing import CliRunner

    from components.cli import app

    clone, project = clone_and_project
    runner = CliRunner()
    ok = runner.invoke(app, ["archive-env", str(clone), "--root", str(project)])
    assert ok.exit_code == 0, ok.output
    assert "scienceworld: run of new, profile ci: 16 files" in ok.output
    assert "merged into: metrics/table1.json, metrics/policy_fidelity.json" in ok.output
    assert "reports/rl_curves.png" in ok.output  # the missing figure is named
    bad = runner.invoke(app, ["archive-env", str(project / "x"), "--root", str(project)])
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines() == [
        f"error: {project / 'x' / 'metrics' / 'table1.json'} is missing: run the pipeline "
        "there first"
    ]
    typo = runner.invoke(app, ["archive-env", str(clone), "--root", str(project / "typo")])
    assert typo.exit_code == 1 and "no such folder" in typo.output
    assert not (project / "typo").exists()  # no new project made there


def test_a_run_of_another_env_is_refused_before_anything_is_written(clone_and_project):
    # the clone ran scienceworld; its miniwob/textworld rows are stale copies, and its
    # stage metrics (data.json, agent/*.json) are scienceworld's
    from typer.testing import CliRunner

    from components.cli import app

    clone, project = clone_and_project
    _write(project / "reports" / "envs" / "miniwob" / "success.png", "the miniwob run's")
    before = {p: p.read_bytes() for p in project.rglob("*") if p.is_file()}
    for env in ("miniwob", "textworld"):
        with pytest.raises(ValueError, match=f"from a scienceworld run, not {env}"):
            archive_env(clone, project, env=env)
    bad = CliRunner().invoke(
        app, ["archive-env", str(clone), "--root", str(project), "--env", "miniwob"]
    )
    assert bad.exit_code == 1
    assert bad.output.strip().splitlines() == [
        f"error: {clone.resolve() / 'metrics' / 'table1.json'} is from a scienceworld run, "
        "not miniwob: archive it with --env scienceworld, or run the miniwob pipeline there first"
    ]
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before

    # a policy-fidelity file of another run than Table 1's is not this env's either
    _write(clone / "metrics" / "policy_fidelity.json", _fidelity("textworld", "new", 0.7))
    with pytest.raises(ValueError, match=r"policy_fidelity\.json is from a textworld run"):
        archive_env(clone, project, env="scienceworld")
    # no env recorded: the run's env cannot be told, even with --env
    _write(clone / "metrics" / "table1.json", {**SOURCE, "_provenance": {"profile": "ci"}})
    with pytest.raises(ValueError, match=r"has no _provenance\.env"):
        archive_env(clone, project, env="scienceworld")
    assert {p: p.read_bytes() for p in project.rglob("*") if p.is_file()} == before
