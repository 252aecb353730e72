"""What GRPO and PPO share: the KL reference, the clipped token loss
and the optimisation loop over the turns of a rollout batch.

Every turn of every episode is one training sequence ``prompt + completion``; only the
completion tokens carry a loss (the prompt holds the task, history, state and admissible
actions written by the environment). Per completion token, with ratio
``rho = exp(logp - logp_old)`` and the turn's advantage ``A``::

    loss_t = -min(rho * A, clip(rho, 1 - clip_low, 1 + clip_high) * A) + beta * w_t * k3_t
    k3_t   = exp(logp_ref - logp) - (logp_ref - logp) - 1        (Schulman's k3 KL estimate)
    w_t    = rho (tokens were sampled from the old policy: importance weight, TRL's default
             ``use_bias_correction_kl``), or 1 with ``kl_ratio_correction=False``

aggregated over tokens (``token``: sum over all completion tokens / their number, TRL's
``bnpo``/``dapo``) or per sequence (``sequence``: mean per turn, then mean over turns, TRL's
``grpo``). This is exactly TRL 1.16's GRPOTrainer loss for those loss types (tested in
tests/agent/test_rl_trl_parity.py).
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, Literal

from components.agent.policy_base import ActResult, TokenScores, TrainablePolicy
from components.agent.rollout import Episode, RolloutBatch
from components.config import RLAlgoConfig
from components.config.base import fields_of
from components.schema import seed_int

if TYPE_CHECKING:
    import torch

Aggregation = Literal["token", "sequence", "episode"]  # episode: turn means, weighted


# Fields that do not change what a run computes: a checkpoint stays valid across them.
RUNTIME_FIELDS = frozenset(
    {"iterations", "save_every", "keep_checkpoints", "max_train_minutes", "max_real_steps"}
)


def seed_everything(seed: int) -> None:
    """Seed python and torch (CPU and CUDA)."""
    import torch

    random.seed(seed)
    torch.manual_seed(seed)


class Reference:
    """Log-probabilities under the frozen starting policy (the KL anchor).

    LoRA: the base model with adapters switched off (no copy). Full fine-tune: a frozen
    deep copy taken at construction, i.e. before any update or checkpoint load.
    """

    def __init__(self, policy: TrainablePolicy) -> None:
        self.policy = policy
        self.copy = None if policy.is_lora else policy.frozen_copy()

    def logprobs(self, acts: Sequence[ActResult], temperature: float) -> list[tuple[float, ...]]:
        """Per-token reference log-probs of each decision."""
        if self.copy is not None:
            return self.copy.act_logprobs(acts, temperature)
        with self.policy.model.disable_adapter():
            return self.policy.act_logprobs(acts, temperature)


@dataclass
class TurnRow:
    """One training sequence: a turn with its advantage and (PPO) value targets."""

    episode: int
    act: ActResult  # the decision as sampled (tokens, or a scoring policy's features)
    advantage: float = 0.0
    ref_logprobs: tuple[float, ...] | None = None
    old_value: float = 0.0
    ret: float = 0.0  # PPO return target

    @property
    def old_logprobs(self) -> tuple[float, ...]:
        """Log-probabilities at sampling time."""
        return self.act.logprobs

    @property
    def completion_ids(self) -> tuple[int, ...]:
        """The trained tokens (a scoring policy: the chosen command's index)."""
        return self.act.completion_ids


def flatten(episodes: Sequence[Episode]) -> list[TurnRow]:
    """Every turn of every trainable episode as a row (empty completions skipped).

    Episodes cut short by an env failure (``env_error``: a crashed simulator, not the
    policy's doing) are not trained on.
    """
    return [
        TurnRow(e, t.act)
        for e, ep in enumerate(episodes)
        if ep.env_error is None
        for t in ep.turns
        if t.act.completion_ids
    ]


def episode_weighted(rows: Sequence[TurnRow]) -> list[TurnRow]:
    """Rows whose advantages are scaled so every episode weighs the same in the loss.

    A turn of an episode with ``n`` trained turns gets ``mean_n / n`` (the mean weight
    stays 1, so the learning rate keeps its meaning).
    """
    turns = Counter(r.episode for r in rows)
    mean = len(rows) / len(turns)
    return [replace(r, advantage=r.advantage * mean / turns[r.episode]) for r in rows]


def pad_rows(rows: Sequence[Sequence[float]], width: int, device: Any) -> torch.Tensor:
    """Right-pad float rows with zeros to ``width`` ([B, width] tensor)."""
    import torch

    return torch.tensor(
        [list(r) + [0.0] * (width - len(r)) for r in rows], dtype=torch.float32, device=device
    )


def clipped_token_loss(
    logps: torch.Tensor,
    old_logps: torch.Tensor,
    ref_logps: torch.Tensor | None,
    advantages: torch.Tensor,
    *,
    clip_low: float,
    clip_high: float,
    beta: float,
    kl_ratio_correction: bool = True,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token clipped surrogate + beta * k3 KL ([B, C]); advantages are [B] or [B, C]."""
    import torch

    adv = advantages.unsqueeze(1) if advantages.dim() == 1 else advantages
    ratio = torch.exp(logps - old_logps)
    clipped = torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    loss = -torch.min(ratio * adv, clipped * adv)
    stats = {
        "clip": ((ratio < 1 - clip_low) & (adv < 0)) | ((ratio > 1 + clip_high) & (adv > 0)),
        "ratio": ratio,
    }
    if beta != 0.0 and ref_logps is not None:
        delta = ref_logps - logps
        kl = torch.exp(delta) - delta - 1
        stats["kl"] = kl
        if kl_ratio_correction:
            kl = kl * ratio
        loss = loss + beta * kl
    return loss, stats


def aggregate(
    per_token: torch.Tensor, mask: torch.Tensor, how: Aggregation, normalizer: float
) -> torch.Tensor:
    """Sum a micro-batch's share of the loss: divide by the minibatch's tokens or turns."""
    if how == "token":
        return (per_token * mask).sum() / normalizer
    per_seq = (per_token * mask).sum(-1) / mask.sum(-1).clamp(min=1.0)
    return per_seq.sum() / normalizer


def turn_loss(
    policy: TrainablePolicy,
    rows: Sequence[TurnRow],
    cfg: RLAlgoConfig,
    normalizer: float,
    with_hidden: bool = False,
) -> tuple[torch.Tensor, TokenScores, dict[str, torch.Tensor]]:
    """The policy loss of some turns (one forward pass), divided by ``normalizer``.

    ``normalizer``: the minibatch's completion tokens (``token``) or turns (``sequence``),
    so micro-batch losses add up to the minibatch's mean.
    """
    import torch

    device = policy.device
    scores = policy.score(
        [r.act for r in rows], cfg.temperature, with_entropy=True, with_hidden=with_hidden
    )
    width = scores.mask.shape[1]
    old = pad_rows([r.old_logprobs for r in rows], width, device)
    ref = pad_rows([r.ref_logprobs or () for r in rows], width, device) if cfg.beta else None
    adv = torch.tensor([r.advantage for r in rows], device=device)
    per_token, stats = clipped_token_loss(
        scores.logprobs,
        old,
        ref,
        adv,
        **fields_of(cfg, "clip_low", "clip_high", "beta", "kl_ratio_correction"),
    )
    if cfg.entropy_coef and scores.entropy is not None:
        # an entropy bonus keeps a small policy from collapsing onto one command early
        per_token = per_token - cfg.entropy_coef * scores.entropy
    stats["per_token"] = per_token
    return aggregate(per_token, scores.mask, cfg.aggregation, normalizer), scores, stats


ExtraLoss = Callable[[TokenScores, Sequence[TurnRow], int], tuple["torch.Tensor", dict[str, float]]]
# the behaviour-cloning term (``sft_coef``): the mean loss on a fresh batch of expert steps
# and the share of them the policy ranks first
DemoLoss = Callable[[], tuple["torch.Tensor", float]]


def optimize(
    policy: TrainablePolicy,
    optimizer: Any,
    rows: Sequence[TurnRow],
    cfg: RLAlgoConfig,
    *,
    params: Sequence[Any],
    seed: int,
    extra_loss: ExtraLoss | None = None,
    with_hidden: bool = False,
    demo_loss: DemoLoss | None = None,
) -> dict[str, float]:
    """Epochs of minibatch optimizer steps over ``rows``; returns mean statistics.

    ``extra_loss(scores, micro_rows, minibatch_turns)`` adds a term per micro-batch (PPO's
    value loss), which it divides by ``minibatch_turns`` itself. ``demo_loss()``: a
    behaviour-cloning loss added once per minibatch, times ``cfg.sft_coef``.
    """
    import torch

    if not rows:
        return {"optimizer_steps": 0.0, "train_turns": 0.0}
    if cfg.aggregation == "episode":
        rows = episode_weighted(rows)
    rng = random.Random(seed)
    sums: dict[str, float] = {}
    counts: dict[str, float] = {}

    def add(name: str, value: float, weight: float = 1.0) -> None:
        sums[name] = sums.get(name, 0.0) + value * weight
        counts[name] = counts.get(name, 0.0) + weight

    # an LM policy's forward pass holds far more per turn than the scorer's: its own
    # scoring batch caps the micro-batch (SmolLM2 at the scorer's 256 grew to 19.5 GB)
    micro_size = min(cfg.micro_batch_size, policy.score_batch_size)
    steps = 0
    policy.model.train()
    for _ in range(cfg.epochs):
        order = list(range(len(rows)))
        rng.shuffle(order)
        size = cfg.minibatch_size or len(order)
        for start in range(0, len(order), size):
            mb = [rows[i] for i in order[start : start + size]]
            n_tokens = sum(len(r.completion_ids) for r in mb)
            normalizer = float(n_tokens if cfg.aggregation == "token" else len(mb))
            optimizer.zero_grad(set_to_none=True)
            for m in range(0, len(mb), micro_size):
                micro = mb[m : m + micro_size]
                loss, scores, st = turn_loss(policy, micro, cfg, normalizer, with_hidden)
                mask = scores.mask
                n_tok = float(mask.sum().item())
                with torch.no_grad():
                    per_token = st["per_token"]
                    add("policy_loss", float((per_token * mask).sum() / max(n_tok, 1.0)), n_tok)
                if extra_loss is not None:
                    extra, extra_stats = extra_loss(scores, micro, len(mb))
                    loss = loss + extra
                    for k, v in extra_stats.items():
                        add(k, v, len(micro))
                loss.backward()
                with torch.no_grad():
                    add("clip_frac", float((st["clip"].float() * mask).sum() / n_tok), n_tok)
                    add("ratio_mean", float((st["ratio"] * mask).sum() / n_tok), n_tok)
                    if "kl" in st:
                        add("kl", float((st["kl"] * mask).sum() / n_tok), n_tok)
                    if scores.entropy is not None:
                        add("entropy", float(scores.entropy.sum() / n_tok), n_tok)
            if demo_loss is not None and cfg.sft_coef:
                # keeps what SFT learned on the expert's states while RL moves the rest
                sft, hit = demo_loss()
                (cfg.sft_coef * sft).backward()
                add("sft_loss", float(sft.detach()))
                add("sft_accuracy", hit)
            grad_norm = torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            add("grad_norm", float(grad_norm))
            optimizer.step()
            steps += 1
    optimizer.zero_grad(set_to_none=True)
    policy.model.eval()
    out = {k: sums[k] / max(counts[k], 1e-12) for k in sums}
    out["optimizer_steps"] = float(steps)
    out["train_turns"] = float(len(rows))
    return out


def update_kl(
    policy: TrainablePolicy, batch: RolloutBatch, temperature: float, max_rows: int = 256
) -> float:
    """KL(pi_old || pi_new) of the update just made, on the batch's sampled tokens.

    The batch was sampled by pi_old (its logprobs are stored), so the unbiased k3
    estimator needs only pi_new's logprobs of the same tokens. For a small update this is
    also KL(pi_new || pi_old) to second order. At most ``max_rows`` turns (evenly spaced)
    are scored, so the cost stays a fraction of the update's.
    """
    from components.evaluation.theorem1 import kl_estimate

    rows = flatten(batch.episodes)
    if not rows:
        return 0.0
    if len(rows) > max_rows:
        stride = len(rows) / max_rows
        rows = [rows[int(i * stride)] for i in range(max_rows)]
    new = policy.act_logprobs([r.act for r in rows], temperature)
    old_flat = [x for r in rows for x in r.old_logprobs]
    new_flat = [x for lp in new for x in lp]
    # kl_estimate(p, q) = KL(p || q) from tokens sampled by p; here p = pi_old
    return kl_estimate(old_flat, new_flat)


def attach_reference(
    reference: Reference | None, rows: Sequence[TurnRow], temperature: float, batch: int
) -> None:
    """Fill each row's reference log-probs (no-op without a reference)."""
    if reference is None:
        return
    for start in range(0, len(rows), batch):
        chunk = rows[start : start + batch]
        ref = reference.logprobs([r.act for r in chunk], temperature)
        for r, lp in zip(chunk, ref, strict=True):
            r.ref_logprobs = lp


class Learner:
    """What the GRPO and PPO learners share: the policy and its settings, the frozen KL
    reference (when ``cfg.beta != 0``), and the optimizer over ``params`` (their own)."""

    params: list[Any]
    optimizer: Any

    def __init__(self, policy: TrainablePolicy, cfg: Any, demo_loss: DemoLoss | None = None):
        self.policy = policy
        self.cfg = cfg
        self.reference = Reference(policy) if cfg.beta != 0.0 else None
        if getattr(cfg, "sft_coef", 0.0) and demo_loss is None:
            raise ValueError("sft_coef > 0 needs expert demonstrations (a demo_loss)")
        self.demo_loss = demo_loss

    def optimize(self, rows: Sequence[TurnRow], iteration: int, **kwargs: Any) -> dict[str, float]:
        """``optimize`` over ``rows`` with this learner's optimizer, shuffled per iteration."""
        return optimize(
            self.policy,
            self.optimizer,
            rows,
            self.cfg,
            params=self.params,
            seed=seed_int(self.cfg.seed, "shuffle", iteration),
            demo_loss=self.demo_loss,
            **kwargs,
        )
