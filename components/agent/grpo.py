"""Multi-turn GRPO: group-relative advantages over n rollouts of the same task.

Why not TRL's GRPOTrainer: its multi-turn paths (``rollout_func``, ``environment_factory``)
train ONE completion per rollout, the whole transcript concatenated, with environment
tokens masked by ``env_mask``. Our policy sees a fresh windowed prompt at every turn (task,
last ``history_len`` steps, current state, admissible actions; policy.py), so an episode is
several (prompt, completion) pairs, not one growing sequence; TRL also steps envs one
rollout at a time, while ours advance all live episodes with one batched env call (the
synthetic env's point). So this file is a compact implementation of the same objective,
and tests/agent/test_rl_trl_parity.py checks that its loss equals TRL's
``GRPOTrainer._compute_loss`` on a single-turn batch.

One round (``GRPO.update``):
1. every episode's outcome reward r_i (1 = task completed);
2. advantage A_i = (r_i - mean_g) / (std_g + 1e-4) over the n episodes of its group g
   (unbiased std, as TRL; ``scale_rewards=False`` keeps only the centring);
3. A_i is broadcast to every completion token of every turn of episode i;
4. clipped-ratio surrogate + beta * k3 KL to the frozen reference (rl.py), AdamW.
Groups whose n rewards are all equal carry no signal (advantage 0): with
``drop_zero_std_groups`` (default) their turns are skipped, as DAPO's dynamic-sampling
filter does (without resampling), which saves the whole update when nothing varied.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Hashable, Sequence
from typing import Any

from components.agent.policy_base import TrainablePolicy
from components.agent.rl import DemoLoss, Learner, attach_reference, flatten
from components.agent.rollout import RolloutBatch
from components.config import GRPOConfig

ADV_EPS = 1e-4  # TRL's epsilon in (r - mean) / (std + eps)
__all__ = ["GRPO", "GRPOConfig", "group_advantages"]


def group_advantages(
    rewards: Sequence[float], groups: Sequence[Hashable], scale: bool = True
) -> list[float]:
    """(r - group mean) / (group std + 1e-4), std unbiased; a single-member group gets 0."""
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(groups):
        members[g].append(i)
    out = [0.0] * len(rewards)
    for idx in members.values():
        values = [float(rewards[i]) for i in idx]
        mean = sum(values) / len(values)
        if len(values) < 2:
            continue
        std = (sum((v - mean) ** 2 for v in values) / (len(values) - 1)) ** 0.5
        for i, v in zip(idx, values, strict=True):
            out[i] = (v - mean) / (std + ADV_EPS) if scale else v - mean
    return out


class GRPO(Learner):
    """The GRPO learner: reference, optimizer and one update per rollout batch."""

    cfg: GRPOConfig

    def __init__(
        self, policy: TrainablePolicy, cfg: GRPOConfig, demo_loss: DemoLoss | None = None
    ) -> None:
        import torch

        super().__init__(policy, cfg, demo_loss)
        self.params = list(policy.trainable_parameters())
        self.optimizer = torch.optim.AdamW(
            self.params, lr=cfg.learning_rate, weight_decay=cfg.weight_decay
        )

    def update(self, batch: RolloutBatch, iteration: int) -> dict[str, float]:
        """One policy update from a batch of grouped episodes; returns statistics."""
        eps = batch.episodes
        # an env failure says nothing about the policy: out of the baseline, not trained on
        ok = [i for i, e in enumerate(eps) if e.env_error is None]
        advantages = [0.0] * len(eps)
        scored = group_advantages(
            [eps[i].reward for i in ok], [eps[i].group for i in ok], self.cfg.scale_rewards
        )
        for i, a in zip(ok, scored, strict=True):
            advantages[i] = a
        rows = flatten(eps)
        if self.cfg.drop_zero_std_groups:  # all-equal groups: zero advantage, compute wasted
            flat = _zero_std_groups(eps)
            rows = [r for r in rows if eps[r.episode].group not in flat]
        for r in rows:
            r.advantage = advantages[r.episode]
        attach_reference(self.reference, rows, self.cfg.temperature, self.policy.score_batch_size)
        stats = self.optimize(rows, iteration)
        stats["frac_zero_std_groups"] = _frac_zero_std(eps)
        stats["mean_abs_advantage"] = sum(abs(a) for a in scored) / max(1, len(scored))
        return stats

    def state_dict(self) -> dict[str, Any]:
        """Optimizer state (the policy weights are saved by the trainer)."""
        return {"optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the optimizer state."""
        self.optimizer.load_state_dict(state["optimizer"])


def _zero_std_groups(episodes: Sequence[Any]) -> set[Hashable]:
    """Groups whose (env-error-free) episodes all have the same reward."""
    rewards: dict[Hashable, set[float]] = defaultdict(set)
    for e in episodes:
        if e.env_error is None:
            rewards[e.group].add(e.reward)
    return {g for g, v in rewards.items() if len(v) == 1}


def _frac_zero_std(episodes: Sequence[Any]) -> float:
    """Share of groups whose rewards are all equal (no learning signal from them)."""
    groups = {e.group for e in episodes}
    return len(_zero_std_groups(episodes)) / max(1, len(groups))
