"""What rollouts and RL need of any policy, LM or scorer: the ``TrainablePolicy`` interface,
the record of one decision (``ActResult``), per-token scores, and the malformed-answer path.

Malformed answers never crash a rollout: the env receives ``MALFORMED_ACTION`` ("noop"),
a verb no environment defines, so the env takes its own invalid-action path (the state
stays as it was, reward 0, one step used).
"""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.agent.policy import Decision, MalformedActionError, Observation, parse_answer

if TYPE_CHECKING:
    import torch

MALFORMED_ACTION = "noop"  # what the env receives for a malformed answer (an unknown verb)


def trainable(module: Any) -> Iterator[torch.nn.Parameter]:
    """The parameters of ``module`` that require gradients."""
    return (p for p in module.parameters() if p.requires_grad)


def frozen(module: Any) -> Any:
    """An independent copy of ``module`` in eval mode, every parameter frozen."""
    out = copy.deepcopy(module).eval()
    for p in out.parameters():
        p.requires_grad_(False)
    return out


@dataclass(frozen=True)
class ActResult:
    """One decision: what was sent to the env and the tokens behind it."""

    action: str  # sent to the env (MALFORMED_ACTION when the answer is malformed)
    text: str  # the decoded completion
    decision: Decision | None  # None when malformed
    error: str | None  # why the answer is malformed
    prompt_ids: tuple[int, ...]
    completion_ids: tuple[int, ...]
    logprobs: tuple[float, ...]  # one per completion token (empty if not requested)
    features: Any = None  # what a non-LM policy needs to rescore the decision (scorer.py)

    @property
    def malformed(self) -> bool:
        """The answer did not follow the format."""
        return self.decision is None


@dataclass(frozen=True)
class TokenScores:
    """Per-token scores of a batch of completions (right-padded to the longest one)."""

    logprobs: torch.Tensor  # [B, C] log pi(token | prefix), 0 on padding
    mask: torch.Tensor  # [B, C] 1.0 on completion tokens, 0.0 on padding
    entropy: torch.Tensor | None  # [B, C] entropy of the tempered distribution
    last_hidden: torch.Tensor | None  # [B, H] final hidden state at the last prompt token


class TrainablePolicy(ABC):
    """What rollouts and RL need of a policy: the LM ``PolicyModel`` (policy_model.py) and
    the scoring ``ScorerPolicy`` (scorer.py) both subclass it."""

    model: Any  # the torch module whose trainable weights are checkpointed
    is_lora: bool
    score_batch_size: int

    @abstractmethod
    def act(
        self, observations: Sequence[Observation], *, temperature: float, max_new_tokens: int
    ) -> list[ActResult]:
        """Sample one decision per observation, with its log-probabilities."""

    def score(
        self,
        acts: Sequence[ActResult],
        temperature: float = 1.0,
        *,
        with_entropy: bool = False,
        with_hidden: bool = False,
    ) -> TokenScores:
        """Rescore sampled decisions under the current weights (gradients follow torch's mode)."""
        return self._score(acts, temperature, with_entropy, with_hidden)

    @abstractmethod
    def _score(
        self, acts: Sequence[ActResult], temperature: float, with_entropy: bool, with_hidden: bool
    ) -> TokenScores:
        """``score`` for this kind of policy."""

    @abstractmethod
    def act_logprobs(
        self, acts: Sequence[ActResult], temperature: float = 1.0
    ) -> list[tuple[float, ...]]:
        """Log-probabilities of sampled decisions (no gradients)."""

    def trainable_parameters(self) -> Iterator[torch.nn.Parameter]:
        """The parameters an optimizer updates: those that require gradients."""
        return trainable(self.model)

    @abstractmethod
    def frozen_copy(self) -> TrainablePolicy:
        """An independent frozen copy (a KL reference)."""

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """Where the weights live."""

    @property
    @abstractmethod
    def hidden_size(self) -> int:
        """Width of the state features a value head reads."""

    @abstractmethod
    def save(self, out_dir: Path) -> None:
        """Save a loadable policy directory."""


def parse_policy_answer(text: str, with_reasoning: bool) -> tuple[Decision | None, str | None]:
    """(decision, None) or (None, why it is malformed); never raises.

    Stricter than ``parse_answer`` on one point: an action with a non-printable character
    is malformed. A tiny policy does sample control bytes, and TextWorld's frotz engine
    crashes the whole process (segfault in ``os_read_line``) on e.g. ``"go\\x13"``.
    """
    try:
        decision = parse_answer(text, with_reasoning)
    except MalformedActionError as err:
        return None, str(err)
    if not decision.action.isprintable():
        return None, "non-printable character in <action>"
    return decision, None
