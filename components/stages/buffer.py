"""Buffer stage: the seed replay buffer in LanceDB, plus a retrieval probe for MLflow."""

from __future__ import annotations

import logging
import random
from typing import Any

from components.config import Config, Paths
from components.io import output_lock
from components.stages.common import numbers, write_json
from components.stages.data import load_tasks

log = logging.getLogger("dreamgym")

PROBE_QUERIES = 200


def build_buffer(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage build_buffer: embed train-split real transitions into data/buffer (tag 'seed')."""
    from components.buffer import ReplayBuffer, build_buffer, load_transitions
    from components.tracking import stage_run

    source = paths.transitions_file
    if not source.exists():
        raise FileNotFoundError(f"{source} missing: run `dreamgym ingest` first")
    family = {t.task_id: t.family for t in load_tasks(paths)}
    data = {"transitions": source}
    with (
        output_lock(paths.buffer, command="build-buffer"),
        stage_run("build_buffer", "buffer", cfg, ("buffer",), paths.root, data) as run,
    ):
        stats = build_buffer(cfg, source, paths.buffer)
        buf = ReplayBuffer.open(paths.buffer, cfg.buffer, create=False)
        held_out = load_transitions(source, splits=("validation",))
        stats.update(retrieval_probe(buf, held_out, family, cfg.seed))
        run.log_metrics(numbers(stats))
        run.log_dict(stats["rows_by_env"], "buffer/rows_by_env.json")
        run.set_tags({"buffer.version": buf.version, "buffer.tag": stats["tag"]})
    write_json(paths.metrics / "buffer.json", numbers(stats))
    log.info("seed buffer: %d rows (%s)", stats["rows"], stats["rows_by_env"])
    return stats


def retrieval_probe(
    buf: Any, queries: list[Any], family: dict[str, str], seed: int
) -> dict[str, float]:
    """Retrieve for held-out (validation) transitions: latency and relevance rates."""
    if not queries:
        return {}
    rng = random.Random(seed)
    sample = rng.sample(queries, min(PROBE_QUERIES, len(queries)))
    k = max(buf.cfg.k, 1)
    results = buf.retrieve_many(sample, k=k, env=None)
    same_family_top1 = [
        bool(hits) and family.get(hits[0][0].task_id) == family.get(q.task_id)
        for q, hits in zip(sample, results, strict=True)
    ]
    same_action_at_k = [
        any(h.action == q.action for h, _ in hits) for q, hits in zip(sample, results, strict=True)
    ]
    probe = {f"probe_{k2}": v for k2, v in buf.retrieval_stats().items()}
    probe["probe_same_family_top1"] = sum(same_family_top1) / len(sample)
    probe["probe_same_action_at_k"] = sum(same_action_at_k) / len(sample)
    return probe
