"""The RL loop on the synthetic env (VectorSyntheticEnv): same loop, zero real steps."""

from __future__ import annotations

from pathlib import Path

from components.agent.policy_model import PolicyModel
from components.agent.rollout import collect_rollouts
from components.agent.train import train_rl
from tests.agent.rl_env import START, magic_grpo, magic_task


def synthetic_env(policy: PolicyModel):
    """A VectorSyntheticEnv whose experience model is a tiny untrained-for-it LM.

    The model answers in the policy format, which the experience model's strict parser
    rejects: every step is resampled once, then the episode ends as a failure.
    """
    from components.config import SyntheticEnvConfig
    from components.experience.dataset import PromptSettings
    from components.experience.synthetic_env import (
        RealStateIndex,
        VectorSyntheticEnv,
        generate_fns,
    )
    from components.lm.generate import Generator

    cfg = SyntheticEnvConfig(max_steps=3, k=0, max_new_tokens=8, gen_batch_size=8)
    generate, resample = generate_fns(Generator(policy.model, policy.tokenizer), cfg)
    index = RealStateIndex(initial_states={magic_task().task_id: START})
    return VectorSyntheticEnv(
        generate, index, cfg=cfg, prompt=PromptSettings(history_len=2, k=0), resample=resample
    )


def test_rollouts_and_training_in_the_synthetic_env_use_no_real_steps(
    magic_policy: PolicyModel, tmp_path: Path
) -> None:
    venv = synthetic_env(magic_policy)
    batch = collect_rollouts(magic_policy, venv, [magic_task()] * 4, max_new_tokens=12)
    assert batch.real_steps == 0
    assert [len(e.turns) for e in batch.episodes] == [1, 1, 1, 1]  # malformed model: failure
    assert all(e.terminated and not e.success for e in batch.episodes)
    assert venv.done
    cfg = magic_grpo(iterations=1, tasks_per_iteration=1, rollouts_per_task=2)
    out = train_rl(magic_policy, venv, [magic_task()], cfg, tmp_path)
    assert out["real_steps"] == 0 and out["episodes"] == 2
