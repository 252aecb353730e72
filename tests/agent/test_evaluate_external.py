"""Bring your own games: games made with `tw-make custom` (settings the generator never
uses) evaluated by `dreamgym evaluate-external`, fed to `generate-tasks` through
tasks.external, and the user's files never deleted or overwritten without --force."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from components.cli import app
from components.config import ExternalGamesConfig, ExternalTaskListConfig, load_config

ROOT = Path(__file__).resolve().parents[2]
TW_MAKE = Path(sys.executable).with_name("tw-make")
# (world size, min objects, quest length, extra flags): none is a generator family's; two
# parallel quests score 2 (denser than won-or-not)
GAMES = {
    "two_rooms": ("2", "3", "2", []),
    "two_quests": ("3", "6", "2", ["--nb-parallel-quests", "2", "--include-adj"]),
    "last_step_only": ("4", "4", "2", ["--only-last-action"]),
}

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def user_games(tmp_path_factory) -> Path:
    """A user's folder: 3 custom games, one .z8 without its .json, and a notes file."""
    folder = tmp_path_factory.mktemp("my_games")
    procs = [
        subprocess.Popen(
            [
                *(str(TW_MAKE), "custom", "--world-size", w, "--nb-objects", n),
                *("--quest-length", q, *extra, "--seed", str(20 + i), "-f", "--silent"),
                *("--output", str(folder / f"{name}.z8")),
            ]
        )
        for i, (name, (w, n, q, extra)) in enumerate(GAMES.items())
    ]
    assert all(p.wait(timeout=120) == 0 for p in procs)
    (folder / "orphan.z8").write_bytes((folder / "two_rooms.z8").read_bytes())  # no .json
    (folder / "notes.txt").write_text("my notes\n")
    return folder


@pytest.fixture(scope="module")
def policy_dir(tmp_path_factory) -> Path:
    """A method folder of two saved (untrained) scoring policies, seed-0 and seed-1."""
    from components.agent.loading import new_scorer, save_policy
    from components.artifacts import seed_dir

    cfg = load_config(ROOT / "params.yaml", "ci")
    folder = tmp_path_factory.mktemp("policy") / "mine"
    for seed in (0, 1):
        meta = {"method": "mine", "seed": seed, "policy": "scorer", "real_steps": 0}
        save_policy(new_scorer(cfg, seed), seed_dir(folder, seed), meta)
    return folder


def _cli(*args: str):
    common = ["--params", str(ROOT / "params.yaml"), "--profile", "ci"]
    return CliRunner().invoke(app, [*args, *common], catch_exceptions=False)


@pytest.fixture(scope="module")
def evaluated(user_games, policy_dir, tmp_path_factory):
    """One `evaluate-external` run on the user's folder: (project root, out folder, result)."""
    root = tmp_path_factory.mktemp("project")
    out = root / "results" / "my_games"
    result = _cli(
        "evaluate-external",
        *("--games", str(user_games), "--policy", str(policy_dir), "--out", str(out)),
        *("--root", str(root)),
    )
    assert result.exit_code == 0, result.output
    return root, out, json.loads((out / "success.json").read_text())


def test_policy_and_random_rows_with_episodes_and_cis(evaluated):
    _, out, result = evaluated
    assert result["n_tasks"] == len(GAMES) and result["n_quarantined"] == 1
    table = result["table"]
    for method in ("policy", "random"):
        row = table[method]
        assert row["episodes"] == len(GAMES) * 2 and row["seeds"] == 2
        assert row["tasks"] == len(GAMES)
        assert 0 <= row["ci_low"] <= row["success"] <= row["ci_high"] <= 1
    assert "vs_random" in table["policy"]
    md = (out / "success.md").read_text()
    assert "| policy (" in md and "| Random (admissible) |" in md
    episodes = [json.loads(line) for line in (out / "episodes.jsonl").read_text().splitlines()]
    assert {e["method"] for e in episodes} == {"policy", "random"}
    quarantined = [
        json.loads(line) for line in (out / "quarantined.jsonl").read_text().splitlines()
    ]
    assert quarantined[0]["source"].endswith("orphan.z8")
    assert "orphan.json missing" in quarantined[0]["reasons"][0]


def test_the_run_is_logged_to_mlflow(evaluated):
    import mlflow

    root, _, _ = evaluated
    mlflow.set_tracking_uri(f"sqlite:///{root / 'mlflow.db'}")
    runs = mlflow.search_runs(experiment_names=["dreamgym-agent"], output_format="list")
    run = next(r for r in runs if r.info.run_name == "evaluate_external")
    assert "policy.success" in run.data.metrics and "random.ci_high" in run.data.metrics


def test_user_files_in_out_are_never_overwritten_without_force(evaluated, user_games, policy_dir):
    root, out, _ = evaluated
    mine = out.parent / "theirs"
    mine.mkdir()
    (mine / "success.md").write_text("the user's own notes\n")
    args = ("--games", str(user_games), "--policy", str(policy_dir), "--root", str(root))
    refused = _cli("evaluate-external", *args, "--out", str(mine))
    assert refused.exit_code == 1 and "--force" in refused.output
    assert (mine / "success.md").read_text() == "the user's own notes\n"
    forced = _cli("evaluate-external", *args, "--out", str(mine), "--force")
    assert forced.exit_code == 0, forced.output
    assert "Random (admissible)" in (mine / "success.md").read_text()


def test_missing_folder_and_no_games_are_one_line_errors(tmp_path, policy_dir):
    (tmp_path / "empty").mkdir()
    for games, message in (("nowhere", "no such folder"), ("empty", "no game")):
        r = _cli(
            "evaluate-external",
            *("--games", str(tmp_path / games), "--policy", str(policy_dir)),
            *("--out", str(tmp_path / "out"), "--root", str(tmp_path)),
        )
        assert r.exit_code == 1 and message in r.output
        assert r.output.count("\n") == 1 and r.output.startswith("error: ")


def test_a_bad_task_list_line_is_quarantined_not_fatal(user_games, tmp_path):
    from components.envs.external import task_list_tasks

    good = {
        "task_id": "mine-1",
        "env": "textworld",
        "family": "mine",
        "difficulty": 2,
        "split": "train",
        "instruction": "Open the locker.",
        "seed": 1,
        "game_file": "two_rooms.z8",  # relative to the list's folder
    }
    lines = [
        json.dumps(good),
        "{not json",
        json.dumps({**good, "task_id": "mine-2", "difficulty": -1}),
        json.dumps({**good, "task_id": "mine-3", "env": "miniwob"}),
        json.dumps({**good, "task_id": "mine-4", "game_file": "gone.z8"}),
        json.dumps({**good, "task_id": "../escape"}),  # its episodes' file would escape
    ]
    task_list = user_games / "tasks.jsonl"
    task_list.write_bytes(("\n".join(lines) + "\n").encode() + b"\xff\xfe\n")
    try:
        found = task_list_tasks(task_list, tmp_path, "test", "textworld")
    finally:
        task_list.unlink()
    assert [t.task_id for t in found.tasks] == ["mine-1"]
    task = found.tasks[0]
    assert task.external and task.split == "test" and Path(task.game_file).is_absolute()
    assert [q["line"] for q in found.quarantined] == [2, 3, 4, 5, 6, 7]
    reasons = " ".join(r for q in found.quarantined for r in q["reasons"])
    whys = ("invalid JSON", "difficulty", "env 'miniwob'", "gone.z8 not found", "names files")
    for why in (*whys, "UTF-8"):
        assert why in reasons
    assert "raw_base64" in found.quarantined[-1]


def test_a_task_lists_root_relative_game_file_is_found(user_games, tmp_path):
    """The pipeline's own data/tasks/tasks.jsonl names games from the project root (every
    row was quarantined as "not found" when read as a task list)."""
    import shutil

    from components.envs.external import task_list_tasks

    (tmp_path / "data" / "tasks" / "games").mkdir(parents=True)
    shutil.copy(user_games / "two_rooms.z8", tmp_path / "data" / "tasks" / "games")
    row = {
        "task_id": "own-1", "env": "textworld", "family": "quest", "difficulty": 1,
        "split": "test", "instruction": "Open the locker.", "seed": 1,
        "game_file": "data/tasks/games/two_rooms.z8",
    }  # fmt: skip
    task_list = tmp_path / "data" / "tasks" / "tasks.jsonl"
    task_list.write_text(json.dumps(row) + "\n")
    found = task_list_tasks(task_list, tmp_path, None, "textworld")
    assert [t.task_id for t in found.tasks] == ["own-1"] and not found.quarantined
    assert found.tasks[0].game_file == "data/tasks/games/two_rooms.z8"


def test_generate_tasks_adds_external_games_and_deletes_only_its_own_files(user_games, evaluated):
    from components import manifest
    from components.config import Paths
    from components.stages.data import generate_tasks
    from tests.integration.textworld_suite import suite_config

    base = suite_config()
    tasks_cfg = base.tasks.model_copy(
        update={
            "families": (base.tasks.families[0].model_copy(update={"n_games": 2}),),
            "external": base.tasks.external.model_copy(
                update={"games": (ExternalGamesConfig(path=str(user_games), split="train"),)}
            ),
        }
    )
    cfg = base.model_copy(update={"tasks": tasks_cfg})
    root = evaluated[0]  # its MLflow store exists already (creating one takes seconds)
    paths = Paths(root)
    games = paths.tasks / "games"
    games.mkdir(parents=True)
    (games / "my_game.z8").write_bytes(b"the user's game")
    (games / "my_game.json").write_text("{}")
    (games / "tw-stale-000-0000000000.z8").write_bytes(b"an old generated game")
    manifest.record(games, ["tw-stale-000-0000000000.z8"], hashed=False)
    # a task list the generator did not write: refused, left untouched
    paths.tasks_file.write_text('{"mine": 1}\n')
    with pytest.raises(manifest.NotOursError, match="--force"):
        generate_tasks(cfg, paths)
    assert paths.tasks_file.read_text() == '{"mine": 1}\n'

    summary = generate_tasks(cfg, paths, force=True)
    assert summary["n_external"] == len(GAMES) and summary["n_external_quarantined"] == 1
    rows = [json.loads(line) for line in paths.tasks_file.read_text().splitlines()]
    external = [r for r in rows if r["external"]]
    assert len(external) == len(GAMES) and {r["split"] for r in external} == {"train"}
    assert all((root / r["game_file"]).is_file() or Path(r["game_file"]).is_file() for r in rows)
    assert (games / "my_game.z8").read_bytes() == b"the user's game"
    assert (games / "my_game.json").exists()
    assert not (games / "tw-stale-000-0000000000.z8").exists()  # ours: pruned
    assert sorted(p.name for p in user_games.iterdir()) == sorted(
        [f"{n}{ext}" for n in GAMES for ext in (".z8", ".json", ".ni")] + ["orphan.z8", "notes.txt"]
    )
    # written by generate-tasks: a second run rewrites it without --force
    again = generate_tasks(cfg, paths)
    assert again["n_external"] == len(GAMES)

    # external train games flow into collection like generated ones: the expert (each
    # game's walkthrough) wins every one of them
    from components.data.collect import collect
    from components.stages.data import load_tasks

    ours = [t for t in load_tasks(paths) if t.external]
    play = cfg.collect.model_copy(
        update={"episodes": {"expert": 1}, "demo_games": None, "workers": 1}
    )
    summary = collect(cfg.model_copy(update={"collect": play}), ours, root / "raw", root, False)
    rows = [json.loads(line) for f in sorted((root / "raw").glob("*.jsonl")) for line in f.open()]
    assert {r["task_id"] for r in rows} == {t.task_id for t in ours}
    assert all(r["success"] and r["steps"] for r in rows), summary


def test_task_list_config_validates_its_split():
    with pytest.raises(ValueError):
        ExternalTaskListConfig(path="x.jsonl", split="holdout")  # type: ignore[arg-type]


def test_a_registry_alias_on_a_task_list(evaluated, user_games, policy_dir, tmp_path):
    from components.config import Paths
    from components.stages.agent import register
    from components.tracking import stage_run

    root, _, _ = evaluated
    cfg = load_config(ROOT / "params.yaml", "ci")
    with stage_run("train_mine", "agent", cfg, (), root) as run:
        register(run, cfg, policy_dir / "seed-0", "mine", {})
    row = {
        "task_id": "mine-1",
        "env": "textworld",
        "family": "mine",
        "difficulty": 2,
        "split": "test",
        "instruction": "",  # a game without a goal
        "seed": 1,
        "game_file": str(user_games / "two_rooms.z8"),
    }
    task_list = tmp_path / "my_tasks.jsonl"
    task_list.write_text(json.dumps(row) + "\n[]\n")
    out = tmp_path / "out"
    r = _cli(
        "evaluate-external",
        *("--tasks", str(task_list), "--policy", "policy@candidate", "--out", str(out)),
        *("--root", str(Paths(root).root)),
    )
    assert r.exit_code == 0, r.output
    result = json.loads((out / "success.json").read_text())
    assert result["registered_model"].startswith("policy/") and result["n_quarantined"] == 1
    assert result["table"]["policy"]["episodes"] == result["table"]["random"]["episodes"] == 1


def test_a_duplicate_external_task_is_quarantined_with_its_content():
    from components.envs.external import ExternalTasks, merge_tasks, quarantine_text
    from tests.factories import make_task

    first = make_task("t1", split="train")
    second = first.model_copy(update={"instruction": "Melt the ice.", "split": "validation"})
    found = ExternalTasks(tasks=[first, second])
    assert merge_tasks([], found) == [first]
    [row] = [json.loads(line) for line in quarantine_text(found.quarantined).splitlines()]
    assert row["reasons"] == ["duplicate task_id 't1'"]
    assert row["task"]["instruction"] == "Melt the ice." and row["task"]["split"] == "validation"
