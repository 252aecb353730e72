"""Offline training of the scoring policy: behaviour cloning (SFT) and DPO.

SFT clones the expert: every step of the expert's episodes on the demonstration games
(``expert_steps``) is one example, the target being the index of the expert's command
among the admissible ones; the loss is the cross-entropy of the softmax over commands.
Noisy or random episodes are never cloned (on the first main 31% of the SFT targets
were not the expert's action).

DPO pairs, in the same state, the expert's command (chosen) with another admissible
command (rejected); the log-probabilities are those of the softmax over commands, the
reference is the frozen SFT policy, and the loss is DPO's on the margin
``m = (lp_c - ref_c) - (lp_r - ref_r)`` (TRL's definitions: sigmoid ``-log sigmoid(beta m)``,
hinge ``relu(1 - beta m)``, ipo ``(m - 1 / (2 beta))^2``) plus ``sft_weight * -lp_c``
(RPO): DPO alone can widen the margin by lowering both commands, and the probability it
frees goes to commands no pair holds.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from components.agent.features import Decision
from components.agent.policy import Observation
from components.agent.scorer import ScorerPolicy, collate
from components.agent.sft_data import observation_at
from components.schema import Trajectory

EXPERT = "expert"
DPO_LOSSES = ("sigmoid", "ipo", "hinge")
TRAIN_SPLIT = "train"
Progress = Callable[[dict[str, float], int], None]


@dataclass(frozen=True)
class Demonstration:
    """One expert decision: what the agent saw and the command the expert chose."""

    task_id: str
    observation: Observation
    action: str


def expert_steps(
    trajectories: Iterable[Trajectory], split: str = TRAIN_SPLIT
) -> tuple[list[Demonstration], dict[str, int]]:
    """Every step of the real expert episodes of ``split`` whose command was admissible."""
    if split == "test":
        raise ValueError("the test split never feeds training or tuning")
    demos: list[Demonstration] = []
    stats = {"episodes": 0, "steps": 0, "skipped_inadmissible": 0}
    for traj in trajectories:
        if traj.split != split or traj.source != "real" or traj.policy != EXPERT:
            continue
        stats["episodes"] += 1
        for i, step in enumerate(traj.steps):
            if not step.admissible_actions or step.action not in step.admissible_actions:
                stats["skipped_inadmissible"] += 1
                continue
            demos.append(Demonstration(traj.task_id, observation_at(traj, i), step.action))
    stats["steps"] = len(demos)
    stats["games"] = len({d.task_id for d in demos})
    return demos, stats


def _targets(policy: ScorerPolicy, demos: Sequence[Demonstration]) -> list[tuple[Decision, int]]:
    decisions = policy.decide([d.observation for d in demos])
    return [(dec, dec.commands.index(d.action)) for dec, d in zip(decisions, demos, strict=True)]


def _fit(
    policy: ScorerPolicy,
    rows: Sequence[Any],
    step: Callable[[Any, list[Any]], tuple[Any, int]],
    hits: str,
    epochs: int,
    batch_size: int,
    seed: int,
    progress: Progress | None,
    **adam: float,
) -> list[dict[str, float]]:
    """Adam over seeded shuffled minibatches of ``rows``; ``step(model, batch)`` gives the
    batch's mean loss and how many of its rows it got right. One row per epoch: the mean
    loss, the share right (as ``hits``) and the epoch; the model is left in eval mode."""
    import torch

    from components.progress import progress_bar

    opt = torch.optim.Adam(policy.trainable_parameters(), **adam)
    rng = random.Random(seed)
    model = policy.model
    model.train()
    history: list[dict[str, float]] = []
    # a bar per run on a terminal only (disable=None); the epochs' losses go to MLflow
    name = "sft" if hits == "accuracy" else "dpo"
    for epoch in progress_bar(
        range(epochs), desc=f"{name} seed {seed}", unit="epoch", leave=False, disable=None
    ):
        order = list(range(len(rows)))
        rng.shuffle(order)
        total, right = 0.0, 0
        for b in range(0, len(order), batch_size):
            batch = [rows[i] for i in order[b : b + batch_size]]
            loss, n_right = step(model, batch)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            total += float(loss.detach()) * len(batch)
            right += n_right
        row = {"loss": total / len(rows), hits: right / len(rows), "epoch": epoch + 1}
        history.append(row)
        if progress is not None:
            progress(row, epoch + 1)
    model.eval()
    return history


def train_sft(
    policy: ScorerPolicy,
    demos: Sequence[Demonstration],
    *,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    weight_decay: float = 0.0,
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """Cross-entropy over admissible commands; returns the final loss and accuracy."""
    import torch

    if not demos:
        raise ValueError("no expert demonstration to clone")
    start = time.perf_counter()
    data = _targets(policy, demos)

    def step(model: Any, batch: list[tuple[Decision, int]]) -> tuple[Any, int]:
        logits, _ = model(*collate([dec for dec, _ in batch]))
        y = torch.tensor([t for _, t in batch])
        loss = torch.nn.functional.cross_entropy(logits, y)
        return loss, int((logits.argmax(-1) == y).sum())

    history = _fit(
        policy,
        data,
        step,
        "accuracy",
        epochs,
        batch_size,
        seed,
        progress,
        lr=learning_rate,
        weight_decay=weight_decay,
    )
    return {
        "train_loss": history[-1]["loss"],
        "train_accuracy": history[-1]["accuracy"],
        "examples": len(data),
        "epochs": epochs,
        "train_seconds": round(time.perf_counter() - start, 2),
        "history": history,
    }


def train_sft_as(
    policy: ScorerPolicy, demos: Sequence[Demonstration], settings: Any, seed: int
) -> dict[str, Any]:
    """``train_sft`` with the agent's SFT ``settings`` (agent.sft: epochs rounded, >= 1)."""
    return train_sft(
        policy,
        demos,
        epochs=max(1, round(settings.epochs)),
        learning_rate=settings.learning_rate,
        batch_size=settings.batch_size,
        weight_decay=settings.weight_decay,
        seed=seed,
    )


class DemoLossFn:
    """RL's behaviour-cloning term: each call, the cross-entropy of the expert's command on
    a seeded random batch of demonstrations (with gradients) and the share ranked first.
    Its sampler's state rides in RL checkpoints, so a resumed run draws the same batches."""

    def __init__(self, policy: ScorerPolicy, data: list[Any], batch_size: int, seed: int):
        self.policy, self.data, self.batch_size = policy, data, batch_size
        self.rng = random.Random(seed)

    def __call__(self) -> tuple[Any, float]:
        import torch

        batch = self.rng.sample(self.data, min(self.batch_size, len(self.data)))
        logits, _ = self.policy.model(*collate([dec for dec, _ in batch]))
        y = torch.tensor([t for _, t in batch], device=logits.device)
        hit = float((logits.argmax(-1) == y).float().mean())
        return torch.nn.functional.cross_entropy(logits, y), hit

    def state_dict(self) -> dict[str, Any]:
        """The batch sampler's state as plain data (checkpoints load weights_only)."""
        version, internal, gauss = self.rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` captured."""
        version, internal, gauss = state["rng"]
        self.rng.setstate((version, tuple(internal), gauss))


def demo_loss_fn(
    policy: ScorerPolicy, demos: Sequence[Demonstration], batch_size: int, seed: int
) -> DemoLossFn:
    """RL's behaviour-cloning term on ``demos`` (see ``DemoLossFn``)."""
    if not demos:
        raise ValueError("sft_coef > 0 but there is no expert demonstration to clone")
    return DemoLossFn(policy, _targets(policy, demos), batch_size, seed)  # the encoder is frozen


def accuracy(policy: ScorerPolicy, demos: Sequence[Demonstration]) -> float:
    """Share of demonstrations where the policy's best-scored command is the expert's."""
    import torch

    if not demos:
        return 0.0
    data = _targets(policy, demos)
    with torch.no_grad():
        logits, _ = policy.model(*collate([dec for dec, _ in data]))
    y = torch.tensor([t for _, t in data])
    return float((logits.argmax(-1) == y).float().mean())


@dataclass(frozen=True)
class PreferencePair:
    """The expert's command preferred over another admissible command in the same state."""

    demo: Demonstration
    rejected: str


def preference_pairs(
    demos: Sequence[Demonstration], max_rejected_per_state: int, seed: int = 0
) -> list[PreferencePair]:
    """Up to ``max_rejected_per_state`` rejected commands per expert state (seeded)."""
    rng = random.Random(seed)
    pairs = []
    for d in demos:
        others = [a for a in d.observation.admissible or () if a != d.action]
        for rejected in rng.sample(others, min(max_rejected_per_state, len(others))):
            pairs.append(PreferencePair(d, rejected))
    return pairs


def dpo_loss(margin: Any, beta: float, loss_type: str = "sigmoid") -> Any:
    """The batch mean of DPO's ``loss_type`` loss on the reward margins (TRL's definitions)."""
    import torch

    if loss_type == "sigmoid":
        return -torch.nn.functional.logsigmoid(beta * margin).mean()
    if loss_type == "hinge":
        return torch.relu(1 - beta * margin).mean()
    if loss_type == "ipo":
        return ((margin - 1 / (2 * beta)) ** 2).mean()
    raise ValueError(f"unknown DPO loss_type {loss_type!r}: one of {DPO_LOSSES}")


def train_dpo(
    policy: ScorerPolicy,
    pairs: Sequence[PreferencePair],
    *,
    beta: float,
    epochs: int,
    learning_rate: float,
    batch_size: int,
    sft_weight: float = 0.0,
    loss_type: str = "sigmoid",
    seed: int = 0,
    progress: Progress | None = None,
) -> dict[str, Any]:
    """DPO (``loss_type``: sigmoid, ipo or hinge; + ``sft_weight`` x NLL of the chosen
    command) from the policy's current weights (the frozen reference); returns the loss."""
    import torch

    if not pairs:
        raise ValueError("no preference pair to train on")
    if loss_type not in DPO_LOSSES:  # before the reference copy and the encoding
        raise ValueError(f"unknown DPO loss_type {loss_type!r}: one of {DPO_LOSSES}")
    start = time.perf_counter()
    reference = policy.frozen_copy().model
    decisions = policy.decide([p.demo.observation for p in pairs])
    rows = [
        (dec, dec.commands.index(p.demo.action), dec.commands.index(p.rejected))
        for dec, p in zip(decisions, pairs, strict=True)
    ]

    def step(model: Any, batch: list[tuple[Decision, int, int]]) -> tuple[Any, int]:
        inputs = collate([dec for dec, _, _ in batch])
        chosen = torch.tensor([c for _, c, _ in batch]).unsqueeze(1)
        rejected = torch.tensor([r for _, _, r in batch]).unsqueeze(1)
        logp = torch.log_softmax(model(*inputs)[0], -1)
        with torch.no_grad():
            ref = torch.log_softmax(reference(*inputs)[0], -1)
        lp_chosen = logp.gather(1, chosen)
        margin = (lp_chosen - ref.gather(1, chosen)) - (
            logp.gather(1, rejected) - ref.gather(1, rejected)
        )
        loss = dpo_loss(margin, beta, loss_type) - sft_weight * lp_chosen.mean()
        return loss, int((margin > 0).sum())

    history = _fit(
        policy, rows, step, "reward_accuracy", epochs, batch_size, seed, progress, lr=learning_rate
    )
    return {
        "train_loss": history[-1]["loss"],
        "reward_accuracy": history[-1]["reward_accuracy"],
        "pairs": len(rows),
        "epochs": epochs,
        "train_seconds": round(time.perf_counter() - start, 2),
        "history": history,
    }
