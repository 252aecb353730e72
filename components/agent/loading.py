"""Create, save and load policies of either kind behind one interface.

``agent.policy`` picks the kind: ``scorer`` (components/agent/scorer.py, the cpu
default) or ``lm`` (a causal LM, components/agent/policy_model.py). A saved policy is a
directory with its weights, a ``policy.json`` meta file (method, seed, real steps its
training used) and either ``scorer.json`` or the LM's ``config.json``;
``load_policy`` tells them apart, so evaluation, RL and the registry never need to know.
Methods keep one directory per training seed: ``models/policy/<method>/seed-<s>``.
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from components.agent.policy import Decision, Observation
from components.agent.policy_base import MALFORMED_ACTION, ActResult
from components.agent.scorer import ScorerPolicy, ScorerSettings, is_scorer_dir
from components.config import AgentConfig, Config, ServingConfig
from components.config.data import PAGE_ENVS
from components.io import read_json, swap_dir

META_FILE = "policy.json"
log = logging.getLogger("dreamgym")


def new_scorer(cfg: Config, seed: int) -> ScorerPolicy:
    """A freshly initialised scoring policy of ``agent.scorer``'s shape."""
    s = cfg.agent.scorer
    settings = ScorerSettings(
        embedder=s.embedder,
        dim=s.dim,
        hidden=s.hidden,
        design=s.design,
        max_steps=cfg.env.max_steps,
        page=cfg.env.name in PAGE_ENVS,
    )
    return ScorerPolicy(settings, seed=seed)


def is_policy_dir(path: Path) -> bool:
    """``path`` holds a saved policy of either kind."""
    return is_scorer_dir(path) or (Path(path) / "config.json").exists()


def load_policy(
    path: Path,
    acfg: AgentConfig | None = None,
    *,
    trainable: bool = False,
    serving: ServingConfig | None = None,
    root: Path | None = None,
    seed: int | None = None,
) -> Any:
    """A saved policy; an LM continuing training gets fresh LoRA adapters if ``agent.lora``.

    ``seed``: the fresh adapters' init seed (None: torch's global RNG, whatever ran before).

    With ``serving.policy_backend == "openai"`` an LM policy that is not ``trainable``
    decodes on the OpenAI-compatible server serving ``path`` (its name: ``policy_model``,
    else ``path`` relative to ``root``); a trained one always decodes here, since a server's
    weights would fall behind after the first update.
    """
    path = Path(path)
    if is_scorer_dir(path):
        return ScorerPolicy.load(path)
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no policy under {path}: train it first")
    from components.agent.policy_model import LoraSettings, PolicyModel

    policy = PolicyModel.from_dir(path)
    if trainable and acfg is not None and acfg.lora:
        policy.add_lora(LoraSettings(r=acfg.lora_r, alpha=acfg.lora_alpha), seed=seed)
    if trainable and acfg is not None and acfg.gradient_checkpointing:
        policy.enable_gradient_checkpointing()
    if not trainable and serving is not None and serving.policy_backend == "openai":
        from components.lm.serving import policy_backend, policy_model_name

        name = policy_model_name(serving, path, root or Path.cwd())
        policy.backend = policy_backend(serving, name)
        log.info("policy %s decodes on %r", path, policy.backend)
    return policy


def save_policy(policy: Any, dst: Path, meta: dict[str, Any]) -> None:
    """Save ``policy`` with its meta to ``dst``, replacing it atomically (tmp + rename)."""
    dst = Path(dst)
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    policy.save(tmp)
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(dst, ignore_errors=True)
    dst.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(dst)


def publish_dir(src: Path, dst: Path, meta: dict[str, Any]) -> None:
    """Copy an already saved policy directory to ``dst`` with its meta, atomically."""
    tmp = Path(dst).with_name(Path(dst).name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    shutil.copytree(src, tmp)
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    swap_dir(tmp, Path(dst))


def read_meta(path: Path) -> dict[str, Any]:
    """The ``policy.json`` of a saved policy ({} when absent)."""
    f = Path(path) / META_FILE
    return read_json(f) if f.exists() else {}


class Acting:
    """A policy answering evaluation's ``act(observations)`` at a fixed temperature.

    ``temperature == 0``: greedy. Sampling draws from torch's global generator, which
    evaluation seeds per run.
    """

    def __init__(self, policy: Any, temperature: float, max_new_tokens: int = 64) -> None:
        self.policy, self.temperature, self.max_new_tokens = policy, temperature, max_new_tokens

    def act(self, observations: Sequence[Observation]) -> list[ActResult]:
        """One decision per observation."""
        # evaluation reads no log-probs: a served policy skips scoring them locally
        served = {"with_logprobs": False} if getattr(self.policy, "backend", None) else {}
        return self.policy.act(
            observations, temperature=self.temperature, max_new_tokens=self.max_new_tokens, **served
        )


class RandomAdmissible:
    """The random baseline: a uniformly random admissible command (seeded)."""

    def __init__(self, seed: int) -> None:
        import random

        self.rng = random.Random(seed)

    def act(self, observations: Sequence[Observation]) -> list[ActResult]:
        """A random admissible command per observation (``noop`` if none is known)."""
        out = []
        for obs in observations:
            options = list(obs.admissible or ())
            action = self.rng.choice(options) if options else MALFORMED_ACTION
            answer = Decision(action, None) if options else None
            out.append(ActResult(action, action, answer, None, (), (), ()))
        return out
