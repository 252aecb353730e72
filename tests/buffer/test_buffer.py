"""Replay buffer on a real LanceDB table in a temp dir, with the packaged embedders."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import components.buffer.table as buffer_table
from components.buffer import (
    BufferCorruptedError,
    BufferReadOnlyError,
    BufferSchemaError,
    BufferVersionError,
    EmbedderMismatchError,
    ReplayBuffer,
    build_buffer,
    embed_text,
    fork_buffer,
    minilm_embedder,
)
from components.buffer.embedders import Embedder
from components.buffer.schema import VECTOR_COLUMN, vectors
from components.buffer.store import TABLE_NAME, table_schema
from components.config import BufferConfig, load_config
from components.experience.coevolution import fork_seed_buffer
from components.schema import Transition, write_jsonl
from tests.buffer.tw_data import GAMES, episode, make_transition
from tests.factories import make_trajectory

ROOT = Path(__file__).resolve().parents[2]
OpenBuffer = Callable[..., ReplayBuffer]


def ids(rows: list[Transition] | list[tuple[Transition, float]]) -> set[str]:
    return {(r[0] if isinstance(r, tuple) else r).id for r in rows}


# ---------------------------------------------------------------- idempotent add


def test_add_twice_changes_nothing(open_buffer: OpenBuffer) -> None:
    buf = open_buffer()
    rows = [t for g in range(3) for t in episode(g, "a")]
    first = buf.add(rows)
    assert (first.inserted, len(buf)) == (15, 15)
    version, n_versions = buf.version, len(buf.versions())

    again = buf.add(rows)
    assert (again.inserted, again.already_present, again.changed) == (0, 15, False)
    # a true no-op: not even a new table version
    assert (buf.version, len(buf.versions())) == (version, n_versions)

    more = episode(4, "b")
    mixed = buf.add(rows[:3] + more + more)
    assert (mixed.inserted, mixed.already_present, mixed.duplicates_in_batch) == (5, 3, 5)
    assert len(buf) == 20
    assert len(open_buffer()) == 20  # persisted, seen by a fresh handle

    # merge on id: the stored row wins, a re-add with another payload overwrites nothing
    buf.add([rows[0].model_copy(update={"action": "dance"})])
    assert buf.get([rows[0].id])[0] == rows[0]


def test_a_text_is_embedded_once_per_handle(tmp_path: Path, wordllama: Embedder) -> None:
    """Another episode through the same (task, state, action) reuses the stored vector."""

    class Counting:
        def __init__(self) -> None:
            self.texts: list[str] = []

        def __getattr__(self, name: str) -> object:
            return getattr(wordllama, name)

        def embed(self, texts: list[str]) -> np.ndarray:
            self.texts += texts
            return wordllama.embed(texts)

    counting = Counting()
    cfg = BufferConfig(embedder="wordllama")
    buf = ReplayBuffer.open(tmp_path / "buffer", cfg, embedder=counting)  # type: ignore[arg-type]
    buf.add(episode(0, "a"))
    embedded = len(counting.texts)
    assert embedded == 5
    buf.add(episode(0, "b"))  # new ids, the same texts: stored, nothing embedded again
    assert len(buf) == 10 and len(counting.texts) == embedded
    same = buf.retrieve(episode(0, "c")[0], k=2)  # a query of a known text neither
    assert len(counting.texts) == embedded and same
    table = buf._scan(["id", VECTOR_COLUMN])
    stored = dict(zip(table["id"].to_pylist(), vectors(table[VECTOR_COLUMN], buf.dim), strict=True))
    a, b = episode(0, "a")[1].id, episode(0, "b")[1].id
    np.testing.assert_array_equal(stored[a], stored[b])


def test_a_full_embedding_cache_keeps_the_batch_vectors(
    open_buffer: OpenBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A batch that overflows the cache and holds a text cached before still embeds."""
    monkeypatch.setattr(buffer_table, "EMBED_CACHE_TEXTS", 6)  # stands in for the 32,768
    buf = open_buffer()
    buf.add(episode(0, "a"))  # 5 texts cached
    # 1 cached text + 5 new ones: 5 + 5 > 6 clears the cache
    queries = episode(0, "b")[:1] + episode(1, "c")
    assert len(buf.retrieve_many(queries, k=2)) == 6
    result = buf.add(episode(0, "d")[:1] + episode(2, "e"))
    assert (result.inserted, len(buf)) == (6, 11)


def test_stored_transitions_round_trip(open_buffer: OpenBuffer) -> None:
    buf = open_buffer()
    rows = episode(2, "x", source="synthetic", iteration=3) + episode(1, "y")
    buf.add(rows)
    assert buf.transitions() == rows  # every field and the provenance survive, in order
    assert buf.verify()["rows"] == 10


# ---------------------------------------------------------------- retrieval filters


def test_filters_env_and_source(open_buffer: OpenBuffer) -> None:
    buf = open_buffer()
    buf.add(
        episode(0, "r1")
        + episode(0, "r2", env="scienceworld")
        + episode(0, "s1", source="synthetic", iteration=1)
    )
    q = make_transition(0, "query", 2)
    everything = buf.retrieve(q, k=50)
    assert len(everything) == 15
    distances = [d for _, d in everything]
    assert distances == sorted(distances)
    for env in ("textworld", "scienceworld"):
        hits = buf.retrieve(q, k=50, env=env)
        assert hits and {t.env for t, _ in hits} == {env}
    assert {t.source for t, _ in buf.retrieve(q, k=50, source="real")} == {"real"}
    synth = buf.retrieve(q, k=50, env="textworld", source="synthetic")
    assert len(synth) == 5 and {(t.env, t.source) for t, _ in synth} == {("textworld", "synthetic")}
    assert buf.retrieve(q, k=0) == []
    with pytest.raises(ValueError, match="source"):
        buf.retrieve(q, source="fake")  # type: ignore[arg-type]


def test_transition_query_never_retrieves_its_own_episode(open_buffer: OpenBuffer) -> None:
    buf = open_buffer()
    own, other = episode(1, "own"), episode(1, "other")
    buf.add(own + other + episode(3, "unrelated"))
    q = own[2]
    hits = buf.retrieve(q, k=10)
    assert q.episode_id not in {t.episode_id for t, _ in hits}
    # its nearest neighbour is the same step of the other episode of the same game
    assert hits[0][0].id == other[2].id and hits[0][1] < 1e-4

    # a text query has no episode: the caller excludes it explicitly
    text = embed_text(q.instruction, q.state, q.action)
    assert q.episode_id in {t.episode_id for t, _ in buf.retrieve(text, k=10)}
    hits = buf.retrieve(text, k=10, exclude_episode=q.episode_id)
    assert q.episode_id not in {t.episode_id for t, _ in hits}

    many = buf.retrieve_many([own[0], other[0]], k=10)
    assert own[0].episode_id not in {t.episode_id for t, _ in many[0]}
    assert other[0].episode_id not in {t.episode_id for t, _ in many[1]}
    stats = buf.retrieval_stats()
    assert stats["retrieval_queries"] == 5 and stats["retrieval_frac_real"] == 1.0
    metrics = buf.metrics()
    assert metrics["rows"] == 15 and metrics["rows_env_textworld"] == 15
    assert all(isinstance(v, float) for v in metrics.values())


@pytest.mark.parametrize("embedder", ["wordllama", "minilm"])
def test_same_game_and_state_rank_above_unrelated(
    tmp_path: Path, wordllama: Embedder, embedder: str
) -> None:
    emb = wordllama if embedder == "wordllama" else minilm_embedder()
    buf = ReplayBuffer.open(tmp_path / "b", BufferConfig(embedder=embedder), embedder=emb)  # type: ignore[arg-type]
    buf.add([t for g in range(len(GAMES)) for t in episode(g, "seen")])
    for game in (0, 3):
        q = make_transition(game, "a-new-episode", 3)
        hits = buf.retrieve(q, k=10)
        top, _ = hits[0]
        assert (top.task_id, top.state, top.action) == (q.task_id, q.state, q.action)
        # the whole game outranks every unrelated game
        assert {t.task_id for t, _ in hits[:5]} == {q.task_id}


# ---------------------------------------------------------------- co-evolution cap


def synthetic_iteration(it: int, games: int = 3) -> list[Transition]:
    return [
        t for g in range(games) for t in episode(g, f"it{it}", source="synthetic", iteration=it)
    ]


@pytest.mark.parametrize("policy", ["oldest", "reservoir"])
def test_eviction_keeps_every_real_row(open_buffer: OpenBuffer, policy: str) -> None:
    buf = open_buffer(synthetic_cap=12, eviction=policy)
    real = [t for g in range(2) for t in episode(g, "seed")]
    buf.add(real)
    offered: list[Transition] = []
    for it in range(1, 5):
        batch = synthetic_iteration(it)
        offered += batch
        buf.add(batch)
        st = buf.stats()
        assert (st["rows_real"], st["rows_synthetic"]) == (10, 12)
    assert ids(buf.transitions(source="real")) == ids(real)
    if policy == "oldest":
        # the cap keeps the newest iteration only (15 rows offered, 12 kept)
        assert buf.stats()["synthetic_rows_by_iteration"] == {4: 12}
    else:
        assert len(buf.stats()["synthetic_rows_by_iteration"]) > 1  # a sample of all of them

    version = buf.version
    replay = buf.add(offered)  # everything offered again: evicted rows stay out
    assert (replay.inserted, replay.evicted, buf.version) == (0, 0, version)

    assert buf.evict_synthetic(cap=5) == 7
    assert buf.evict_synthetic(cap=5) == 0
    assert buf.evict_synthetic(cap=0, policy="reservoir") == 5
    st = buf.stats()
    assert (st["rows_real"], st["rows_synthetic"]) == (10, 0)
    assert ids(buf.transitions(source="real")) == ids(real)


@pytest.mark.parametrize("policy", ["oldest", "reservoir"])
def test_kept_synthetic_set_does_not_depend_on_arrival_order(
    tmp_path: Path, open_buffer: OpenBuffer, policy: str
) -> None:
    offered = [t for it in range(1, 4) for t in synthetic_iteration(it)]
    a = open_buffer(tmp_path / "a", synthetic_cap=10, eviction=policy)
    a.add(offered)
    b = open_buffer(tmp_path / "b", synthetic_cap=10, eviction=policy)
    shuffled = list(reversed(offered))
    for i in range(0, len(shuffled), 7):
        b.add(shuffled[i : i + 7])
    assert ids(a.transitions()) == ids(b.transitions())
    assert len(a) == 10


def test_re_adding_after_a_kill_before_eviction_repairs_the_cap(
    open_buffer: OpenBuffer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Insert and eviction are two commits: the rerun's add evicts what is over the cap."""
    buf = open_buffer(synthetic_cap=5, eviction="oldest")
    buf.add(synthetic_iteration(0, games=1))
    batch = synthetic_iteration(1, games=1)[:3]

    class Killed(BaseException):
        pass

    def killed(*_: object, **__: object) -> None:
        raise Killed  # the process dies between the insert and the eviction commit

    monkeypatch.setattr(buf._table, "delete", killed)
    with pytest.raises(Killed):
        buf.add(batch)
    resumed = open_buffer(synthetic_cap=5, eviction="oldest")
    assert resumed.stats()["rows_synthetic"] == 8
    again = resumed.add(batch)
    assert (again.inserted, again.evicted) == (0, 3)
    assert resumed.stats()["synthetic_rows_by_iteration"] == {0: 2, 1: 3}
    version = resumed.version
    assert not resumed.add(batch).changed and resumed.version == version  # within cap: a no-op


# ---------------------------------------------------------------- versions


def test_tags_restore_the_older_view(tmp_path: Path, open_buffer: OpenBuffer, wordllama) -> None:
    buf = open_buffer()
    seed = episode(0, "seed")
    buf.add(seed)
    buf.tag("seed")
    buf.add(synthetic_iteration(1, games=2))
    buf.tag("iter-1")
    assert len(buf) == 15

    buf.checkout("seed")
    assert buf.read_only and len(buf) == 5 and ids(buf.transitions()) == ids(seed)
    hits = buf.retrieve(make_transition(1, "q", 1), k=20)
    assert {t.source for t, _ in hits} == {"real"}  # retrieval sees the old view only
    with pytest.raises(BufferReadOnlyError):
        buf.add(episode(2, "z"))
    buf.checkout_latest()
    assert len(buf) == 15

    # a fresh handle can replay an experiment against the buffer it saw
    cfg = BufferConfig(embedder="wordllama")
    old = ReplayBuffer.open(tmp_path / "buffer", cfg, embedder=wordllama, version="iter-1")
    assert len(old) == 15 and old.read_only

    assert buf.tag("iter-1") == buf.tags()["iter-1"]  # same version: no-op
    buf.add(episode(2, "late"))
    with pytest.raises(BufferVersionError, match="already points"):
        buf.tag("iter-1")
    with pytest.raises(BufferVersionError, match="invalid tag"):
        buf.tag("bad name")
    with pytest.raises(BufferVersionError, match="unknown tag"):
        buf.checkout("nope")

    restored = buf.restore("seed")
    assert len(buf) == 5 and not buf.read_only and restored == buf.version
    assert {v["version"] for v in buf.versions()} >= {buf.tags()["iter-1"], buf.tags()["seed"]}
    buf.checkout("iter-1")
    assert len(buf) == 15  # history kept after the restore


def test_fork_copies_versions_and_tags(tmp_path: Path, open_buffer: OpenBuffer) -> None:
    src = open_buffer()
    src.add(episode(0, "a"))
    src.tag("seed")
    dst_path = fork_buffer(src.path, tmp_path / "grown")
    dst = open_buffer(dst_path)
    dst.add(synthetic_iteration(1, games=1))
    assert (len(dst), len(src)) == (10, 5)
    dst.checkout("seed")
    assert len(dst) == 5
    with pytest.raises(Exception, match="already exists"):
        fork_buffer(src.path, tmp_path / "grown")


@pytest.mark.parametrize("existing", [False, True])
def test_fork_killed_mid_copy_leaves_no_partial_buffer(
    tmp_path: Path,
    open_buffer: OpenBuffer,
    wordllama: Embedder,
    monkeypatch: pytest.MonkeyPatch,
    existing: bool,
) -> None:
    """A resumed stage re-forks: the destination is the old copy or none, never a part."""
    cfg = BufferConfig(embedder="wordllama")
    src = open_buffer()
    for g in range(3):
        src.add(episode(g, "a"))
    src.tag("seed")
    work = tmp_path / "work"
    if existing:  # an older fork that the kill must leave whole
        fork_buffer(src.path, work)
        open_buffer(work).add(episode(4, "old"))

    class Killed(BaseException):
        pass

    real_copytree, real_copy2, copied = shutil.copytree, shutil.copy2, []

    def copy2(s: str, d: str, **kw: object) -> object:
        if len(copied) == 3:
            raise Killed  # the process dies part-way through the copy
        copied.append(s)
        return real_copy2(s, d, **kw)

    def copytree(s: Path, d: Path, *args: object, **kw: object) -> object:
        if not args:  # the top call (subfolders pass the copy function on positionally)
            kw["copy_function"] = copy2
        return real_copytree(s, d, *args, **kw)

    monkeypatch.setattr(shutil, "copytree", copytree)
    with pytest.raises(Killed):
        fork_buffer(src.path, work, overwrite=True)
    monkeypatch.undo()
    if existing:
        assert len(open_buffer(work)) == 20  # the old copy, whole
    else:
        assert not (work / "transitions.lance").exists()

    resumed = fork_seed_buffer(src.path, work, cfg, embedder=wordllama, fresh=existing)
    assert (len(resumed), resumed.tags()) == (15, src.tags())
    assert [p.name for p in work.iterdir() if p.name.startswith(".transitions")] == []


# ---------------------------------------------------------------- ANN index


def test_ann_index_agrees_with_exact_search_and_keeps_filters(open_buffer: OpenBuffer) -> None:
    buf = open_buffer(index_min_rows=256)
    rows = [
        make_transition(g, f"e{e}", s, note=f"{g}-{e}-{s} {'abcdefgh'[e % 8] * (e % 5 + 1)}")
        for g in range(len(GAMES))
        for e in range(140)
        for s in range(5)
    ]
    # two rows of a rare env, far from the probes below: a filter on it matches only them
    rare = [make_transition(5, "rare", s, env="scienceworld", note="zz") for s in (0, 4)]
    buf.add(rare + rows[:198])
    assert not buf.stats()["indexed"]  # below index_min_rows: flat search
    buf.add(rows[200:])
    st = buf.stats()
    # 4202 rows: 65 partitions of which 36 are probed, so the index really prunes
    assert st["indexed"] and st["index_partitions"] == 65 and st["unindexed_rows"] == 0

    queries = [
        make_transition(g, "probe", s, note=f"probe {g} {s}") for g in range(6) for s in (1, 3)
    ]
    recall = []
    for q in queries:
        ann, exact = buf.retrieve(q, k=10), buf.retrieve(q, k=10, exact=True)
        recall.append(len(ids(ann) & ids(exact)) / 10)
        filtered = buf.retrieve(q, k=5, env="textworld", exclude_episode=rows[0].episode_id)
        assert len(filtered) == 5 and rows[0].episode_id not in {t.episode_id for t, _ in filtered}
    assert np.mean(recall) >= 0.95

    # a selective filter whose only matches lie outside the probed partitions still
    # finds them (the search keeps probing until k match or the table is exhausted)
    for q in queries:
        assert ids(buf.retrieve(q, k=5, env="scienceworld")) == ids(rare)

    # rows added after the index was trained are still found
    fresh = make_transition(4, "fresh", 2, note="a purple elephant juggles teacups")
    buf.add([fresh])
    text = embed_text(fresh.instruction, fresh.state, fresh.action)
    assert buf.retrieve(text, k=1)[0][0].id == fresh.id


# ---------------------------------------------------------------- failures


def _seeded(open_buffer: OpenBuffer) -> Path:
    buf = open_buffer()
    buf.add(episode(0, "a"))
    return buf.path / f"{TABLE_NAME}.lance"


def test_corrupted_manifest_is_a_clear_error_and_nothing_is_recreated(
    open_buffer: OpenBuffer,
) -> None:
    table_dir = _seeded(open_buffer)
    for manifest in (table_dir / "_versions").glob("*.manifest"):
        manifest.write_bytes(b"garbage")
    with pytest.raises(BufferCorruptedError, match=r"transitions\.lance"):
        open_buffer()
    assert all(m.read_bytes() == b"garbage" for m in (table_dir / "_versions").glob("*.manifest"))


def test_missing_versions_is_corruption_not_an_empty_buffer(open_buffer: OpenBuffer) -> None:
    table_dir = _seeded(open_buffer)
    shutil.rmtree(table_dir / "_versions")
    with pytest.raises(BufferCorruptedError, match="no readable table version"):
        open_buffer()
    assert any((table_dir / "data").iterdir())  # the data files were left alone


def test_missing_data_file_is_detected_on_open(open_buffer: OpenBuffer) -> None:
    table_dir = _seeded(open_buffer)
    for f in (table_dir / "data").iterdir():
        f.unlink()
    with pytest.raises(BufferCorruptedError, match="corrupted or missing files"):
        open_buffer()


def test_schema_mismatch_names_the_columns(
    tmp_path: Path, open_buffer: OpenBuffer, wordllama
) -> None:
    import lancedb  # only to forge a foreign table; the code under test owns LanceDB

    good = table_schema(wordllama.dim, wordllama.name)
    fields = [f for f in good if f.name != "reward"]
    fields.append(good.field("reward").with_name("score"))
    forged = lancedb.connect(str(tmp_path / "forged"))
    forged.create_table(TABLE_NAME, schema=pa.schema(fields, metadata=good.metadata))
    with pytest.raises(BufferSchemaError, match=r"missing columns \['reward'\].*'score'"):
        open_buffer(tmp_path / "forged")

    plain = lancedb.connect(str(tmp_path / "plain"))
    plain.create_table(TABLE_NAME, schema=good.remove_metadata())
    with pytest.raises(BufferSchemaError, match="not a DreamGym replay buffer"):
        open_buffer(tmp_path / "plain")


def test_embedder_mismatch_is_refused_without_touching_data(
    tmp_path: Path, open_buffer: OpenBuffer
) -> None:
    _seeded(open_buffer)

    class Other:
        name = "other-model"
        dim = 256

        def embed(self, texts: list[str]) -> np.ndarray:
            return np.ones((len(texts), 256), dtype=np.float32)

    with pytest.raises(EmbedderMismatchError, match=r"wordllama.*other-model"):
        ReplayBuffer.open(tmp_path / "buffer", BufferConfig(), embedder=Other())
    assert len(open_buffer()) == 5


# ---------------------------------------------------------------- seed buffer


def test_build_buffer_from_ingested_files(tmp_path: Path, wordllama: Embedder) -> None:
    import pandas as pd

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    cfg = cfg.model_copy(update={"buffer": BufferConfig(embedder="wordllama")})
    trajs = [make_trajectory(4, idx=i, split="train") for i in range(3)]
    trajs.append(make_trajectory(4, idx=9, split="validation"))
    # the ingest stage's parquet layout: flattened provenance_* columns plus the split
    frame = pd.DataFrame(
        [
            {
                **s.model_dump(mode="json", exclude={"provenance"}),
                **{f"provenance_{k}": v for k, v in s.provenance.model_dump().items()},
                "split": t.split,
            }
            for t in trajs
            for s in t.steps
        ]
    )
    parquet = tmp_path / "transitions.parquet"
    frame.to_parquet(parquet, index=False)

    stats = build_buffer(cfg, parquet, tmp_path / "seed", embedder=wordllama)
    assert (stats["rows"], stats["rows_real"], stats["inserted"], stats["tag"]) == (
        12,
        12,
        12,
        "seed",
    )
    again = build_buffer(cfg, parquet, tmp_path / "seed", embedder=wordllama)
    assert (again["inserted"], again["version"]) == (0, stats["version"])

    buf = ReplayBuffer.open(tmp_path / "seed", cfg.buffer, embedder=wordllama)
    assert buf.tags() == {"seed": stats["version"]}
    assert ids(buf.transitions()) == {s.id for t in trajs[:3] for s in t.steps}

    jsonl = tmp_path / "trajectories.jsonl"
    write_jsonl(jsonl, trajs)
    from_jsonl = build_buffer(cfg, jsonl, tmp_path / "seed2", embedder=wordllama)
    assert from_jsonl["rows"] == 12

    synthetic = [make_transition(0, "s", 0, source="synthetic", iteration=1)]
    with pytest.raises(ValueError, match="real transitions only"):
        build_buffer(cfg, synthetic, tmp_path / "seed3", embedder=wordllama)
