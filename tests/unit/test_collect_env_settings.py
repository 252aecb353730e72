"""collect resumes data/raw by episode id, and an id does not hash every env setting: the
episodes of other env settings are set aside, never resumed (components/stages/collect.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.config import Config, Paths, SplitCountsConfig, load_config
from components.schema import write_jsonl
from components.stages import collect as stage
from tests.factories import make_task

ROOT = Path(__file__).resolve().parents[2]
EPISODE = '{"episode_id": "e"}\n'


def _sw(**settings) -> Config:
    """The ci config on ScienceWorld, with ``settings`` of env.scienceworld."""
    cfg = load_config(ROOT / "params.yaml", "ci")
    sw = cfg.env.scienceworld.model_copy(update=settings)
    env = cfg.env.model_copy(update={"name": "scienceworld", "scienceworld": sw})
    return cfg.model_copy(update={"env": env})


def _collected(raw: Path, cfg: Config) -> Path:
    """``raw`` as a collection under ``cfg`` left it: an episode file and the record."""
    raw.mkdir(parents=True, exist_ok=True)
    (raw / "sw-task.jsonl").write_text(EPISODE)
    stage.check_env_settings(cfg, raw)
    return raw


def test_a_fresh_collection_records_its_settings_and_moves_nothing(tmp_path: Path):
    raw = tmp_path / "data" / "raw"
    assert stage.check_env_settings(_sw(), raw) is None
    assert sorted(p.name for p in raw.iterdir()) == [stage.ENV_SETTINGS_FILE]
    assert json.loads((raw / stage.ENV_SETTINGS_FILE).read_text()) == stage.episode_settings(_sw())
    assert sorted(p.name for p in tmp_path.joinpath("data").iterdir()) == ["raw"]


@pytest.mark.parametrize(
    "change", [{"simplifications": "easy"}, {"max_admissible": 8}], ids=["simplify", "admissible"]
)
def test_changed_env_settings_set_the_old_episodes_aside(tmp_path: Path, change, caplog):
    raw = _collected(tmp_path / "data" / "raw", _sw())
    aside = stage.check_env_settings(_sw(**change), raw)
    assert aside is not None and aside.parent == raw.parent
    assert aside.name.startswith(stage.ASIDE_PREFIX)
    assert (aside / "sw-task.jsonl").read_text() == EPISODE  # kept, out of the pipeline's way
    assert (aside / ".gitignore").read_text() == "*\n"
    assert sorted(p.name for p in raw.iterdir()) == [stage.ENV_SETTINGS_FILE]
    recorded = json.loads((raw / stage.ENV_SETTINGS_FILE).read_text())
    assert recorded == stage.episode_settings(_sw(**change))
    (key,) = change
    assert f"scienceworld.{key}" in caplog.text and "collecting afresh" in caplog.text


def test_unchanged_settings_and_the_suite_size_keep_the_episodes(tmp_path: Path):
    raw = _collected(tmp_path / "data" / "raw", _sw())
    assert stage.check_env_settings(_sw(), raw) is None
    # the task list is the suite's business (the plan drops episodes of dropped tasks)
    more = _sw(variations=SplitCountsConfig(train=5, validation=1, test=1))
    assert stage.check_env_settings(more, raw) is None
    assert (raw / "sw-task.jsonl").read_text() == EPISODE
    # another env's settings are not this env's episodes' business either
    tw = load_config(ROOT / "params.yaml", "ci")
    raw_tw = _collected(tmp_path / "tw" / "raw", tw)
    other = tw.env.scienceworld.model_copy(update={"simplifications": "easy"})
    changed = tw.model_copy(update={"env": tw.env.model_copy(update={"scienceworld": other})})
    assert stage.check_env_settings(changed, raw_tw) is None


def test_episodes_collected_before_settings_were_recorded_are_kept(tmp_path: Path):
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "sw-task.jsonl").write_text(EPISODE)
    assert stage.check_env_settings(_sw(simplifications="easy"), raw) is None
    assert (raw / "sw-task.jsonl").read_text() == EPISODE
    assert (raw / stage.ENV_SETTINGS_FILE).exists()


def test_the_settings_are_the_episode_shaping_keys_of_the_active_env():
    settings = stage.episode_settings(_sw())
    assert set(settings) >= {"name", "max_steps", "reward", "scienceworld"}
    assert "miniwob" not in settings and "agentgym" not in settings
    assert {"simplifications", "max_admissible"} <= set(settings["scienceworld"])
    assert "variations" not in settings["scienceworld"]
    pages = _sw().model_copy(update={"env": _sw().env.model_copy(update={"name": "miniwob"})})
    assert set(stage.episode_settings(pages)["miniwob"]) == {"max_elements"}


def test_the_collect_command_sets_aside_before_it_collects(tmp_path: Path, monkeypatch):
    from components.stages import data

    paths = Paths(tmp_path)
    task = make_task("sw-task", env="scienceworld", family="find-animal")
    write_jsonl(paths.tasks_file, [task])
    _collected(paths.raw, _sw())
    seen: list[list[str]] = []

    def collect(cfg, paths):  # the real collection plays ScienceWorld: what it would find
        seen.append(sorted(p.name for p in paths.raw.iterdir()))
        return {"n_trajectories": 0}

    monkeypatch.setattr(data, "collect", collect)
    summary = stage.collect(_sw(simplifications="easy"), paths)
    assert seen == [[stage.ENV_SETTINGS_FILE]]  # no old episode to resume
    assert Path(summary["set_aside"]).joinpath("sw-task.jsonl").read_text() == EPISODE
    # the same settings again: nothing moves, the summary is the collection's own
    assert stage.collect(_sw(simplifications="easy"), paths) == {"n_trajectories": 0}


def test_an_empty_plan_moves_nothing(tmp_path: Path, monkeypatch):
    from components.stages import data

    paths = Paths(tmp_path)
    write_jsonl(paths.tasks_file, [make_task("sw-task", env="scienceworld", split="test")])
    _collected(paths.raw, _sw())
    monkeypatch.setattr(data, "collect", lambda cfg, paths: {"called": True})
    assert stage.collect(_sw(simplifications="easy"), paths) == {"called": True}
    assert (paths.raw / "sw-task.jsonl").read_text() == EPISODE


def test_an_unreadable_record_sets_the_episodes_aside_and_says_why(tmp_path: Path, caplog):
    raw = _collected(tmp_path / "data" / "raw", _sw())
    (raw / stage.ENV_SETTINGS_FILE).write_text("{not json")
    aside = stage.check_env_settings(_sw(), raw)
    assert aside is not None and (aside / "sw-task.jsonl").read_text() == EPISODE
    assert "its record is unreadable" in caplog.text
    assert json.loads((raw / stage.ENV_SETTINGS_FILE).read_text()) == stage.episode_settings(_sw())


def test_settings_records_and_aside_names(tmp_path: Path):
    from components.io import read_settings_record, unused_stamped_dir

    record = tmp_path / "settings.json"
    assert read_settings_record(record) is None  # never recorded
    for text in ("{broken", "[1, 2]", "\xff"):  # unreadable or not an object: unknown
        record.write_text(text, encoding="latin-1")
        assert read_settings_record(record) == {}
    record.write_text('{"a": 1}')
    assert read_settings_record(record) == {"a": 1}
    first = unused_stamped_dir(tmp_path / "raw-aside-")
    assert first.parent == tmp_path and first.name.startswith("raw-aside-")
    first.mkdir()
    second = unused_stamped_dir(tmp_path / "raw-aside-")
    assert second != first and not second.exists()  # within the same second: "<stamp>-2"
