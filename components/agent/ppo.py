"""Multi-turn PPO: a learned value, GAE over turns, clipped ratio and value, KL penalty.

TRL 1.16 has no PPOTrainer (removed with its value-head model classes), so this is a
compact implementation. Design choices:
- the value model is a linear head on the policy's final hidden state at the last prompt
  token (shared backbone, as TRL's former ``AutoModelForCausalLMWithValueHead``): V(s_t) is
  the value of the state the policy sees before answering turn t;
- the time step of GAE is the *turn*: delta_t = r_t + gamma V(s_{t+1}) - V(s_t), with
  V = 0 after the last turn (the episode's end is its outcome: won, lost or out of steps),
  A_t = sum_k (gamma lambda)^k delta_{t+k}; returns R_t = A_t + V(s_t). A_t is broadcast to
  every completion token of turn t;
- the KL to the frozen reference is a penalty in the loss (k3, as in GRPO), not reward
  shaping, so both algorithms regularise identically;
- advantages are normalised over the batch, or within groups (``group_fn(task)``, e.g. the
  curriculum's semantic clusters of tasks; PPO has no task groups of its own);
- value loss 0.5 max((V - R)^2, (V_clip - R)^2), V_clip = V_old + clip(V - V_old, +-value_clip).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any

from components.agent.policy_base import TokenScores, TrainablePolicy
from components.agent.rl import DemoLoss, Learner, TurnRow, attach_reference, flatten
from components.agent.rollout import RolloutBatch
from components.config import PPOConfig
from components.schema import Task

if TYPE_CHECKING:
    import torch

NORM_EPS = 1e-8
__all__ = ["PPO", "PPOConfig", "gae", "normalize", "value_head"]


def gae(
    rewards: Sequence[float], values: Sequence[float], gamma: float, lam: float
) -> tuple[list[float], list[float]]:
    """(advantages, returns) of one episode; the value after the last turn is 0."""
    n = len(rewards)
    adv = [0.0] * n
    running = 0.0
    for t in reversed(range(n)):
        next_value = values[t + 1] if t + 1 < n else 0.0
        delta = rewards[t] + gamma * next_value - values[t]
        running = delta + gamma * lam * running
        adv[t] = running
    return adv, [a + v for a, v in zip(adv, values, strict=True)]


def normalize(values: Sequence[float], groups: Sequence[Hashable] | None = None) -> list[float]:
    """Standardise within each group (one group when ``groups`` is None)."""
    keys = list(groups) if groups is not None else [0] * len(values)
    members: dict[Hashable, list[int]] = defaultdict(list)
    for i, g in enumerate(keys):
        members[g].append(i)
    out = list(map(float, values))
    for idx in members.values():
        vals = [out[i] for i in idx]
        mean = sum(vals) / len(vals)
        std = (sum((v - mean) ** 2 for v in vals) / len(vals)) ** 0.5
        for i in idx:
            out[i] = (out[i] - mean) / (std + NORM_EPS) if len(idx) > 1 else out[i] - mean
    return out


def value_head(hidden_size: int) -> torch.nn.Linear:
    """A zero-initialised linear value head (V = 0 before training)."""
    import torch

    head = torch.nn.Linear(hidden_size, 1)
    torch.nn.init.zeros_(head.weight)
    torch.nn.init.zeros_(head.bias)
    return head


class PPO(Learner):
    """The PPO learner: policy + value head, reference, optimizer."""

    cfg: PPOConfig

    def __init__(
        self,
        policy: TrainablePolicy,
        cfg: PPOConfig,
        group_fn: Callable[[Task], Hashable] | None = None,
        demo_loss: DemoLoss | None = None,
    ) -> None:
        import torch

        super().__init__(policy, cfg, demo_loss)
        self.group_fn = group_fn
        self.value_head = value_head(policy.hidden_size).to(policy.device)
        policy_params = list(policy.trainable_parameters())
        self.params = policy_params + list(self.value_head.parameters())
        self.optimizer = torch.optim.AdamW(
            [
                {"params": policy_params, "lr": cfg.learning_rate},
                {"params": list(self.value_head.parameters()), "lr": cfg.value_learning_rate},
            ],
            weight_decay=cfg.weight_decay,
        )

    def values(self, rows: Sequence[TurnRow]) -> list[float]:
        """V(s_t) of each row's prompt under the current weights (no gradients)."""
        import torch

        out: list[float] = []
        batch = self.policy.score_batch_size
        with torch.no_grad():
            for start in range(0, len(rows), batch):
                chunk = rows[start : start + batch]
                scores = self.policy.score(
                    [r.act for r in chunk], self.cfg.temperature, with_hidden=True
                )
                out.extend(self._value(scores).tolist())
        return out

    def _value(self, scores: TokenScores) -> torch.Tensor:
        assert scores.last_hidden is not None
        return self.value_head(scores.last_hidden.float()).squeeze(-1)

    def update(self, batch: RolloutBatch, iteration: int) -> dict[str, float]:
        """GAE over each episode's turns, then clipped policy + value optimisation."""
        eps = batch.episodes
        rows = flatten(eps)
        self.policy.model.eval()
        for r, v in zip(rows, self.values(rows), strict=True):
            r.old_value = v
        by_episode: dict[int, list[TurnRow]] = defaultdict(list)
        for r in rows:
            by_episode[r.episode].append(r)
        for e, ep_rows in by_episode.items():
            rewards = [t.reward for t in eps[e].turns if t.act.completion_ids]
            adv, ret = gae(rewards, [r.old_value for r in ep_rows], self.cfg.gamma, self.cfg.lam)
            for r, a, g in zip(ep_rows, adv, ret, strict=True):
                r.advantage, r.ret = a, g
        if self.cfg.normalize_advantages and rows:
            groups = [self.group_fn(eps[r.episode].task) for r in rows] if self.group_fn else None
            for r, a in zip(rows, normalize([r.advantage for r in rows], groups), strict=True):
                r.advantage = a
        attach_reference(self.reference, rows, self.cfg.temperature, self.policy.score_batch_size)

        def value_loss(
            scores: TokenScores, micro: Sequence[TurnRow], minibatch_turns: int
        ) -> tuple[Any, dict[str, float]]:
            import torch

            device = scores.logprobs.device
            v = self._value(scores)
            old = torch.tensor([r.old_value for r in micro], device=device)
            ret = torch.tensor([r.ret for r in micro], device=device)
            v_clip = old + torch.clamp(v - old, -self.cfg.value_clip, self.cfg.value_clip)
            per_turn = 0.5 * torch.max((v - ret) ** 2, (v_clip - ret) ** 2)
            # divided by the minibatch's turns, like the policy loss's normaliser
            loss = self.cfg.vf_coef * per_turn.sum() / minibatch_turns
            stats = {
                "value_loss": float(per_turn.detach().mean()),
                "value_mean": float(v.detach().mean()),
            }
            return loss, stats

        stats = self.optimize(rows, iteration, extra_loss=value_loss, with_hidden=True)
        stats["return_mean"] = sum(r.ret for r in rows) / max(1, len(rows))
        return stats

    def state_dict(self) -> dict[str, Any]:
        """Optimizer and value-head state (the policy weights are saved by the trainer)."""
        return {
            "optimizer": self.optimizer.state_dict(),
            "value_head": self.value_head.state_dict(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore the optimizer and the value head."""
        self.value_head.load_state_dict(state["value_head"])
        self.optimizer.load_state_dict(state["optimizer"])
