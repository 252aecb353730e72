"""Promotion after a pipeline run: ``experience-model@champion`` and ``policy@champion``.

    experience model  the candidate (registered by train_experience_model --variant full)
                      becomes champion if its held-out fidelity beats the champion's by
                      ``promotion.margin`` and its trivial baselines (majority class,
                      "nothing changes"): components/evaluation/promotion.py
    policy            Table 1's best held-out success becomes champion if it beats the
                      random-admissible baseline and the champion's success

The Prefect ``pipeline`` flow runs the same rules after the stages that feed them; this
is the same thing for a ``make run`` / ``dvc repro`` user (``dreamgym promote``).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from components.config import Config, Paths
from components.io import read_json

if TYPE_CHECKING:
    from components.evaluation.promotion import Decision

log = logging.getLogger("dreamgym")


def promote_experience_model(cfg: Config, paths: Paths) -> Decision:
    """Apply the promotion rule to ``experience-model@candidate`` (after its fidelity)."""
    from components.evaluation.promotion import EXPERIENCE_FLOORS, apply_promotion
    from components.stages.experience import REGISTERED_MODEL

    decision = apply_promotion(
        paths.root,
        REGISTERED_MODEL,
        cfg.promotion.experience_metric,
        cfg.promotion.margin,
        floors=tuple(m for m, _ in EXPERIENCE_FLOORS),  # beat the trivial baselines first
    )
    log.info("promotion of %s: %s", REGISTERED_MODEL, decision)
    return decision


def promote_policy(cfg: Config, paths: Paths) -> Decision:
    """``policy@champion``: Table 1's best held-out success, if above random and the champion."""
    from components.evaluation.promotion import ablation_of, apply_policy_promotion
    from components.stages.agent import REGISTERED_MODEL, TABLE1_METRICS

    table1_file = paths.metrics / TABLE1_METRICS
    if not table1_file.exists():
        raise FileNotFoundError(f"{table1_file} missing: run `dreamgym table1` (or make run)")
    table1 = read_json(table1_file)
    decision = apply_policy_promotion(
        paths.root,
        table1,
        cfg.promotion.margin,
        name=REGISTERED_MODEL,
        env=cfg.env.name,
        ablation=ablation_of(cfg.ablation.model_dump()),
        seed_of=lambda method: cfg.seeds_of(method)[0],  # the seed each stage registers
    )
    log.info("promotion of %s: %s", REGISTERED_MODEL, decision)
    return decision


def promote(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Both promotion rules; what each decided and why."""
    out: dict[str, Any] = {}
    for name, rule in (("experience_model", promote_experience_model), ("policy", promote_policy)):
        d = rule(cfg, paths)
        out[name] = {"promoted": d.promote, "reason": d.reason, "version": d.candidate_version}
    return out
