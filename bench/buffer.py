"""Replay-buffer benchmark: insert rate, ANN vs exact retrieval at 10K/100K rows, embed rates.

``python -m bench.buffer`` writes bench/results/buffer.json. Tables hold synthetic
transitions with 384-d vectors (MiniLM's dimension) drawn from a hierarchical mixture
(env -> game -> state -> noise), so neighbours cluster the way real (task, state, action)
embeddings do; query vectors are fresh draws, never rows of the table. Latencies are
``ReplayBuffer.retrieve`` end to end (search + rows back as Transitions) with a
precomputed query vector; embedding cost is reported separately per embedder.
"""

from __future__ import annotations

import json
import os
import platform
import tempfile
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.common import bench_parser

if __name__ == "__main__":  # before numpy and lancedb load: --help returns at once
    bench_parser("bench.buffer", __doc__).parse_args()

import numpy as np

from components.buffer.embedders import (
    MINILM_DIM,
    WordLlamaEmbedder,
    embed_text,
    minilm_embedder,
    normalize_rows,
)
from components.buffer.store import ReplayBuffer, ivf_nprobes
from components.config import BufferConfig
from components.schema import Provenance, Transition, stable_id

RESULTS = Path("bench/results")
SIZES = (10_000, 100_000)
N_QUERIES = 200
K = 10
INSERT_BATCH = 5_000
TARGET_RECALL = 0.95
TARGET_P99_MS = 20.0
ENVS = ("textworld", "scienceworld", "miniwob")
N_GAMES = 300
STATES_PER_GAME = 17
STEPS_PER_EPISODE = 20
EPISODE_GAME_STRIDE = 7919  # episode e plays game (e * stride) % N_GAMES
NOISE = 1.5  # per-point noise relative to the state centre (1.5: neighbours overlap)
ROOMS = ("kitchen", "garden", "cellar", "library", "garage", "attic", "bathroom", "hallway")
THINGS = ("apple", "key", "map", "shovel", "lamp", "coin", "book", "knife", "soap", "box")


class Corpus:
    """Synthetic transitions and their vectors, plus a generator of query vectors."""

    def __init__(self, dim: int, seed: int = 0) -> None:
        self.dim = dim
        self.rng = np.random.default_rng(seed)
        common = self._unit(1)
        envs = normalize_rows(common + self._unit(len(ENVS)))
        self.game_env = self.rng.integers(0, len(ENVS), N_GAMES)
        games = normalize_rows(envs[self.game_env] + 0.8 * self._unit(N_GAMES))
        state_game = np.repeat(np.arange(N_GAMES), STATES_PER_GAME)
        self.centres = normalize_rows(games[state_game] + 0.7 * self._unit(len(state_game)))

    def _unit(self, n: int) -> np.ndarray:
        return normalize_rows(self.rng.normal(0, 1, (n, self.dim)))

    def _points(self, game: np.ndarray, state: np.ndarray) -> np.ndarray:
        centre = self.centres[game * STATES_PER_GAME + state]
        noise = self.rng.normal(0, NOISE / np.sqrt(self.dim), centre.shape)
        return normalize_rows(centre + noise)

    def rows(self, start: int, n: int) -> tuple[list[Transition], np.ndarray]:
        """Rows ``start .. start+n`` of the table: episodes of 20 steps in random games."""
        idx = np.arange(start, start + n)
        episode = idx // STEPS_PER_EPISODE
        game = (episode * EPISODE_GAME_STRIDE) % N_GAMES  # deterministic game per episode
        state = self.rng.integers(0, STATES_PER_GAME, n)
        rows = [
            _transition(
                int(game[i]), int(episode[i]), int(idx[i] % STEPS_PER_EPISODE), int(state[i])
            )
            for i in range(n)
        ]
        return rows, self._points(game, state)

    def queries(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Fresh query vectors and the game each was drawn from."""
        game = self.rng.integers(0, N_GAMES, n)
        state = self.rng.integers(0, STATES_PER_GAME, n)
        return self._points(game, state), game


def _transition(game: int, episode: int, step: int, state: int) -> Transition:
    env = ENVS[(game * 31) % len(ENVS)]
    room, thing = ROOMS[(game + state) % len(ROOMS)], THINGS[(game * 3 + state) % len(THINGS)]
    episode_id = stable_id("bench", episode)
    text = f"-= {room.title()} =-\nYou are in the {room}. You see a {thing} (state {state})."
    return Transition(
        id=Transition.make_id(episode_id, step),
        task_id=f"{env}-game-{game}",
        env=env,
        episode_id=episode_id,
        step_index=step,
        instruction=f"Find the {thing} in the {room} (game {game}).",
        state=text,
        action=f"take {thing}",
        next_state=text + " Taken.",
        reward=0,
        done=False,
        admissible_actions=None,
        valid_action=True,
        source="real" if episode % 4 else "synthetic",
        provenance=Provenance(policy="bench", iteration=0 if episode % 4 else 1),
    )


def _percentiles(ms: list[float]) -> tuple[float, float]:
    return float(np.percentile(ms, 50)), float(np.percentile(ms, 99))


def _measure(
    buf: ReplayBuffer, queries: np.ndarray, filters: list[dict[str, Any]]
) -> dict[str, float]:
    """ANN vs exact on the same queries and filters: recall@10 and latencies."""
    for q, f in zip(queries[:10], filters[:10], strict=True):  # warm caches
        buf.retrieve(q, K, **f)
    ann_ms, exact_ms, recall = [], [], []
    for q, f in zip(queries, filters, strict=True):
        t0 = time.perf_counter()
        ann = buf.retrieve(q, K, **f)
        t1 = time.perf_counter()
        exact = buf.retrieve(q, K, exact=True, **f)
        t2 = time.perf_counter()
        ann_ms.append((t1 - t0) * 1000)
        exact_ms.append((t2 - t1) * 1000)
        truth = {t.id for t, _ in exact}
        recall.append(len(truth & {t.id for t, _ in ann}) / max(len(truth), 1))
    p50, p99 = _percentiles(ann_ms)
    e50, e99 = _percentiles(exact_ms)
    return {
        "recall_at_10": round(float(np.mean(recall)), 4),
        "p50_ms": round(p50, 2),
        "p99_ms": round(p99, 2),
        "exact_p50_ms": round(e50, 2),
        "exact_p99_ms": round(e99, 2),
    }


def bench_size(size: int, corpus: Corpus, workdir: Path) -> dict[str, Any]:
    """Insert ``size`` rows, build the index, compare ANN with exact search."""
    # index_min_rows above the size: insertion is timed alone, the index is built after
    cfg = BufferConfig(embedder="minilm", index_min_rows=10 * size, synthetic_cap=size)
    buf = ReplayBuffer.open(workdir / f"buffer-{size}", cfg, embedder=minilm_embedder())
    insert_s = 0.0
    last: list[Transition] = []
    last_vecs = np.zeros((0, corpus.dim), dtype=np.float32)
    for start in range(0, size, INSERT_BATCH):
        last, last_vecs = corpus.rows(start, min(INSERT_BATCH, size - start))
        t0 = time.perf_counter()
        buf.add(last, embeddings=last_vecs)
        insert_s += time.perf_counter() - t0
    t0 = time.perf_counter()
    noop = buf.add(last, embeddings=last_vecs)  # idempotency check on a full batch
    noop_s = time.perf_counter() - t0
    assert noop.inserted == 0 and len(buf) == size

    flat_ms = []
    for q in corpus.queries(50)[0]:  # what the buffer does below index_min_rows
        t0 = time.perf_counter()
        buf.retrieve(q, K)
        flat_ms.append((time.perf_counter() - t0) * 1000)
    flat_p50, flat_p99 = _percentiles(flat_ms)
    t0 = time.perf_counter()
    partitions = buf.build_index()
    build_s = time.perf_counter() - t0
    unfiltered = _measure(buf, *_query_set(corpus, with_filters=False))
    filtered = _measure(buf, *_query_set(corpus, with_filters=True))
    return {
        "rows": size,
        "insert_rows_per_s": round(size / insert_s, 1),
        "noop_readd_rows_per_s": round(len(last) / noop_s, 1),
        "index": "IVF_FLAT cosine",
        "index_partitions": partitions,
        "nprobes": ivf_nprobes(partitions),
        "index_build_s": round(build_s, 2),
        **unfiltered,
        "flat_no_index_p50_ms": round(flat_p50, 2),
        "flat_no_index_p99_ms": round(flat_p99, 2),
        "filtered": filtered,
    }


def _query_set(corpus: Corpus, with_filters: bool) -> tuple[np.ndarray, list[dict[str, Any]]]:
    vecs, games = corpus.queries(N_QUERIES)
    if not with_filters:
        return vecs, [{} for _ in games]
    # the experience model's usual call: same env, never the querying episode (here the
    # first episode played in the query's game, so the exclusion really removes rows)
    inverse = pow(EPISODE_GAME_STRIDE, -1, N_GAMES)
    filters = [
        {
            "env": ENVS[(int(g) * 31) % len(ENVS)],
            "exclude_episode": stable_id("bench", (int(g) * inverse) % N_GAMES),
        }
        for g in games
    ]
    return vecs, filters


def bench_embedders(n_minilm: int = 256, n_wordllama: int = 5_000) -> dict[str, dict[str, float]]:
    """Texts per second of each packaged embedder on realistic (task, state, action) texts."""
    corpus = Corpus(MINILM_DIM, seed=1)
    rows, _ = corpus.rows(0, n_wordllama)
    texts = [embed_text(t.instruction, t.state + " " + t.next_state * 3, t.action) for t in rows]
    out = {}
    for name, emb, n in (
        ("minilm", minilm_embedder(), n_minilm),
        ("wordllama", WordLlamaEmbedder(), n_wordllama),
    ):
        t0 = time.perf_counter()
        emb.embed(texts[:8])  # load + warm up
        load_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        vecs = emb.embed(texts[:n])
        seconds = time.perf_counter() - t0
        assert vecs.shape == (n, emb.dim)
        out[name] = {
            "texts_per_s": round(n / seconds, 1),
            "texts": n,
            "dim": emb.dim,
            "load_s": round(load_s, 2),
            "mean_chars": round(float(np.mean([len(t) for t in texts[:n]])), 1),
        }
    return out


def main() -> dict[str, Any]:
    """Run the buffer benchmark; writes bench/results/buffer.json."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    started = time.perf_counter()
    load_before = os.getloadavg()[0]
    corpus = Corpus(MINILM_DIM)
    sizes = {}
    with tempfile.TemporaryDirectory(prefix="bench-buffer-") as tmp:
        for size in SIZES:
            sizes[str(size)] = bench_size(size, corpus, Path(tmp))
            print(f"buffer {size}: {json.dumps(sizes[str(size)])}", flush=True)
    embed = bench_embedders()
    largest = sizes[str(max(SIZES))]
    result = {
        "insert_rows_per_s": largest["insert_rows_per_s"],
        "sizes": sizes,
        "embed_texts_per_s": {name: e["texts_per_s"] for name, e in embed.items()},
        "embedders": embed,
        "targets": {"recall_at_10": TARGET_RECALL, "p99_ms_at_100000": TARGET_P99_MS},
        "meets_targets": {
            "recall_at_10": all(s["recall_at_10"] >= TARGET_RECALL for s in sizes.values()),
            "p99_ms_at_100000": largest["p99_ms"] <= TARGET_P99_MS,
        },
        "setup": {
            "data": f"synthetic hierarchical clusters, {MINILM_DIM}-d, noise {NOISE}",
            "queries": N_QUERIES,
            "k": K,
            "insert_batch": INSERT_BATCH,
            "cpus": os.cpu_count(),
            "load_avg_at_start": round(load_before, 2),
            "machine": platform.machine(),
            "lancedb": metadata.version("lancedb"),
            "seconds": round(time.perf_counter() - started, 1),
        },
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "buffer.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("insert_rows_per_s", "embed_texts_per_s")}))
    return result


if __name__ == "__main__":
    main()
