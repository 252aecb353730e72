"""SFT and DPO of the generative LM policy (``agent.policy = lm``, the gpu profile).

One training seed per call, in the stage process (a GPU is shared, not split): TRL's
SFTTrainer clones the expert's successful train trajectories (answer-only loss on
``<think>...</think><action>...</action>``), TRL's DPOTrainer continues from that seed's
SFT policy on offline preference pairs. Checkpoints resume after a kill; the policy is
saved to ``models/policy/<method>/seed-<s>``. The stage (components/stages/agent.py)
logs and registers the results.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import asdict
from typing import Any

from components.artifacts import DPO, SFT, base_cache_dir, policy_checkpoint_dir, policy_dir
from components.config import AgentConfig, Config, Paths
from components.stages.agent import load_trajectories

log = logging.getLogger("dreamgym")

# budgets, logging and evaluation knobs do not change the trained weights
_NOT_IN_FINGERPRINT = {
    "eval": True,
    "sft": {"max_train_minutes", "logging_steps", "save_steps", "eval_loss_examples"},
    "dpo": {"max_train_minutes", "logging_steps", "save_steps"},
    "seeds": True,
    "workers": True,
}

# the agent fields DPO training reads besides agent.dpo (components/agent/baselines.py)
_DPO_AGENT_FIELDS = ("max_length", "lora", "lora_r", "lora_alpha", "bf16")


def _digest(records: Sequence[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for r in records:
        h.update(json.dumps(r, sort_keys=True).encode("utf-8"))
    return h.hexdigest()[:16]


def train_sft_lm(cfg: Config, paths: Paths, seed: int) -> dict[str, Any]:
    """SFT of the LM policy for one seed; returns its metrics and log history."""
    from components.agent.baselines import (
        load_base_policy,
        policy_settings,
        save_policy,
        train_sft_policy,
    )
    from components.agent.sft_data import build_sft_examples, corpus
    from components.experience.sft import prepare_checkpoints
    from components.lm.models import count_parameters

    acfg = cfg.agent.model_copy(update={"seed": seed})
    s = acfg.sft
    settings = policy_settings(acfg)
    trajectories = load_trajectories(paths)
    train, stats = build_sft_examples(
        trajectories,
        settings,
        policies=s.policies,
        skip_invalid=s.skip_invalid,
        limit=s.max_train_examples,
        seed=seed,
    )
    if not train:
        raise ValueError("no successful train-split trajectory to clone")
    held_out = (
        build_sft_examples(
            trajectories, settings, limit=s.eval_loss_examples, seed=seed, split="validation"
        )[0]
        if s.eval_loss_examples
        else []
    )
    fingerprint = {
        "agent": acfg.model_dump(mode="json", exclude=_NOT_IN_FINGERPRINT),
        "settings": asdict(settings),
        "examples": _digest([ex.to_sft() for ex in train]),
    }
    ckpt = policy_checkpoint_dir(paths, SFT, seed)
    prepare_checkpoints(ckpt, fingerprint)
    model, tokenizer = load_base_policy(
        acfg, list(corpus(train)), base_cache_dir(paths), ckpt / "tokenizer"
    )
    n_params = count_parameters(model)
    model, result = train_sft_policy(
        model, tokenizer, train, acfg, ckpt, fingerprint=fingerprint, eval_examples=held_out
    )
    meta = {
        "method": SFT,
        "seed": seed,
        "policy": "lm",
        "base_model": acfg.model,
        "n_parameters": n_params,
        "real_steps": 0,
        "examples_digest": fingerprint["examples"],
    }
    save_policy(model, tokenizer, policy_dir(paths, SFT, seed), settings, meta)
    shutil.rmtree(ckpt, ignore_errors=True)  # finished: the next run starts fresh
    return {
        **result.metrics(),
        **{f"data_{k}": v for k, v in stats.items()},
        "n_parameters": n_params,
        "history": [dict(h, epoch=h.get("epoch", i)) for i, h in enumerate(result.log_history)],
    }


def dpo_fingerprint(acfg: AgentConfig, sft_md5: str, pairs: Sequence[Any]) -> dict[str, Any]:
    """What a DPO checkpoint resumes only under: the settings that shape its weights."""
    return {
        "dpo": acfg.dpo.model_dump(mode="json", exclude=_NOT_IN_FINGERPRINT["dpo"]),
        # the trainer also reads these (the adapter and precision): a change starts afresh
        "agent": acfg.model_dump(mode="json", include=set(_DPO_AGENT_FIELDS)),
        "sft_model": sft_md5,
        "pairs": _digest([p.to_dpo() for p in pairs]),
    }


def train_dpo_lm(cfg: Config, paths: Paths, seed: int) -> dict[str, Any]:
    """DPO of the LM policy for one seed, from that seed's SFT policy."""
    from components.agent.baselines import load_settings, save_policy, train_dpo_policy
    from components.agent.dpo_data import build_pairs
    from components.experience.sft import prepare_checkpoints
    from components.lm.models import load_pretrained_dir
    from components.tracking import dvc_md5

    acfg = cfg.agent.model_copy(update={"seed": seed})
    d = acfg.dpo
    sft_dir = policy_dir(paths, SFT, seed)
    settings = load_settings(sft_dir)  # the SFT policy's prompt shape
    pairs, stats = build_pairs(
        load_trajectories(paths),
        settings,
        max_rejected_per_state=d.max_rejected_per_state,
        limit=d.max_pairs,
        seed=seed,
    )
    if not pairs:
        raise ValueError("no preference pair could be built from the train trajectories")
    fingerprint = dpo_fingerprint(acfg, dvc_md5(sft_dir), pairs)
    ckpt = policy_checkpoint_dir(paths, DPO, seed)
    prepare_checkpoints(ckpt, fingerprint)
    model, tokenizer = load_pretrained_dir(sft_dir)
    model, result = train_dpo_policy(model, tokenizer, pairs, acfg, ckpt, fingerprint=fingerprint)
    meta = {
        "method": DPO,
        "seed": seed,
        "policy": "lm",
        "init": SFT,
        "real_steps": 0,
        "preference_pairs": result.n_pairs,
    }
    save_policy(model, tokenizer, policy_dir(paths, DPO, seed), settings, meta)
    shutil.rmtree(ckpt, ignore_errors=True)
    return {
        **result.metrics(),
        **{f"data_{k}": v for k, v in stats.items()},
        "history": [dict(h, epoch=h.get("epoch", i)) for i, h in enumerate(result.log_history)],
    }
