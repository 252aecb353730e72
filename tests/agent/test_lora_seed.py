"""Fresh LoRA adapters of an RL run are seeded by the run's seed, not the global RNG."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from components.config import AgentConfig, Paths, load_config

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def saved_lm_policy(tmp_path_factory) -> Path:
    """A tiny LM policy saved to disk."""
    from components.agent.policy_model import PolicyModel
    from tests.agent.rl_env import corpus

    path = tmp_path_factory.mktemp("lora_seed") / "policy"
    PolicyModel.tiny(corpus(), preset="nano", vocab_size=400).save(path)
    return path


def _lora_a(policy: Any) -> Any:
    return next(v for n, v in policy.model.named_parameters() if "lora_A" in n).detach().clone()


def test_fresh_adapters_depend_on_the_seed_only(saved_lm_policy: Path, one_thread) -> None:
    import torch

    from components.agent.loading import load_policy

    acfg = AgentConfig(lora=True, policy="lm")
    inits = []
    for prior in (0, 1):  # whatever the worker's previous job left in the global RNG
        torch.manual_seed(prior)
        inits.append(_lora_a(load_policy(saved_lm_policy, acfg, trainable=True, seed=7)))
    assert torch.equal(inits[0], inits[1])
    other = _lora_a(load_policy(saved_lm_policy, acfg, trainable=True, seed=8))
    assert not torch.equal(inits[0], other)
    # the seeded init forks the RNG: the global stream goes on as if nothing was drawn
    torch.manual_seed(3)
    expected = torch.rand(4)
    torch.manual_seed(3)
    load_policy(saved_lm_policy, acfg, trainable=True, seed=7)
    assert torch.equal(torch.rand(4), expected)


def test_rl_runs_load_their_start_with_a_seed_of_their_own(tmp_path: Path, monkeypatch) -> None:
    import components.agent.loading as loading
    import components.stages.rl_seed as rl
    from components.artifacts import REAL

    seeds: list[Any] = []

    class Loaded(Exception):
        pass

    def fake_load(path: Path, acfg: Any = None, **kw: Any) -> Any:
        seeds.append(kw.get("seed"))
        raise Loaded  # what load_policy was given is all this test needs

    cfg = load_config(ROOT / "params.yaml", profile="cpu")
    monkeypatch.setattr(rl, "_train_tasks", lambda paths: [])
    monkeypatch.setattr(loading, "load_policy", fake_load)
    for seed in (0, 1):
        with pytest.raises(Loaded):
            rl.rl_seed(cfg, Paths(tmp_path), "grpo", REAL, seed)
    assert None not in seeds and seeds[0] != seeds[1]
