"""A rebuilt seed buffer holds exactly the ingested train transitions, nothing stale."""

from __future__ import annotations

from pathlib import Path

from components.buffer import ReplayBuffer, build_buffer
from components.buffer.embedders import Embedder
from components.config import BufferConfig, load_config
from components.schema import write_jsonl
from tests.factories import make_trajectory

ROOT = Path(__file__).resolve().parents[2]


def _cfg():
    cfg = load_config(ROOT / "params.yaml", profile="ci")
    return cfg.model_copy(update={"buffer": BufferConfig(embedder="wordllama")})


def _stored(seed: Path, cfg, wordllama: Embedder) -> dict[str, str]:
    buf = ReplayBuffer.open(seed, cfg.buffer, embedder=wordllama)
    return {t.id: t.state for t in buf.transitions()}


def test_rebuild_drops_transitions_no_longer_ingested(tmp_path: Path, wordllama: Embedder):
    cfg, seed, jsonl = _cfg(), tmp_path / "seed", tmp_path / "trajectories.jsonl"
    trajs = [make_trajectory(3, idx=i, split="train") for i in range(3)]
    write_jsonl(jsonl, trajs)
    first = build_buffer(cfg, jsonl, seed, embedder=wordllama)
    assert first["rows"] == 9

    # a raw file went away: its episode is no longer ingested
    write_jsonl(jsonl, trajs[:2])
    second = build_buffer(cfg, jsonl, seed, embedder=wordllama)
    assert set(_stored(seed, cfg, wordllama)) == {s.id for t in trajs[:2] for s in t.steps}
    assert (second["rows"], second["removed_stale"], second["inserted"]) == (6, 3, 0)
    buf = ReplayBuffer.open(seed, cfg.buffer, embedder=wordllama)
    assert buf.tags()["seed"] == second["version"] > first["version"]

    # same input again: nothing written, the tag stays
    again = build_buffer(cfg, jsonl, seed, embedder=wordllama)
    assert (again["version"], again["removed_stale"], again["inserted"]) == (
        second["version"],
        0,
        0,
    )
    # history is kept: the old seed version still holds the dropped episode
    old = ReplayBuffer.open(seed, cfg.buffer, embedder=wordllama, version=first["version"])
    assert len(old) == 9


def test_rebuild_replaces_a_transition_whose_content_changed(tmp_path: Path, wordllama: Embedder):
    cfg, seed, jsonl = _cfg(), tmp_path / "seed", tmp_path / "trajectories.jsonl"
    traj = make_trajectory(2, idx=0, split="train")
    write_jsonl(jsonl, [traj])
    build_buffer(cfg, jsonl, seed, embedder=wordllama)

    # the raw line was fixed in place: same episode, same transition ids, new text
    steps = [traj.steps[0].model_copy(update={"state": "a corrected state"}), traj.steps[1]]
    edited = traj.model_copy(update={"steps": steps})
    write_jsonl(jsonl, [edited])
    stats = build_buffer(cfg, jsonl, seed, embedder=wordllama)

    assert (stats["rows"], stats["removed_stale"], stats["inserted"]) == (2, 1, 1)
    assert _stored(seed, cfg, wordllama)[traj.steps[0].id] == "a corrected state"


def test_no_train_transition_left_is_an_error_not_an_emptied_buffer(
    tmp_path: Path, wordllama: Embedder
):
    import pytest

    from components.io import InputError

    cfg, seed, jsonl = _cfg(), tmp_path / "seed", tmp_path / "trajectories.jsonl"
    write_jsonl(jsonl, [make_trajectory(3, idx=0, split="train")])
    first = build_buffer(cfg, jsonl, seed, embedder=wordllama)
    # every raw line quarantined (e.g. the tasks were regenerated): only validation is left
    write_jsonl(jsonl, [make_trajectory(3, idx=1, split="validation")])
    with pytest.raises(InputError, match=r"no real train-split transition in .*quarantined"):
        build_buffer(cfg, jsonl, seed, embedder=wordllama)
    buf = ReplayBuffer.open(seed, cfg.buffer, embedder=wordllama)
    assert len(buf) == 3 and buf.tags()["seed"] == first["version"]
