"""The cpu-profile policy: a small head scoring every admissible command.

pi(a | o) = softmax over the admissible commands of ``f(features(o, a)) / temperature``,
where ``features`` come from frozen text embeddings and the agent's episode memory
(components/agent/features.py) and ``f`` is a ~0.3M-parameter MLP. The log-probability
of the chosen command plays the role token log-probabilities play for an LM policy, so
SFT, DPO, GRPO and PPO train it through the same interface as ``PolicyModel``
(components/agent/policy_model.py): ``act`` samples and returns ``ActResult``s (their
``features`` hold the decision; ``completion_ids`` is the chosen index), ``score``
recomputes log-probabilities, entropies and the value features of given decisions.

Why: on two cores a generative LM cannot learn to name objects of unseen games (it
memorised training action strings on the first main); choosing among admissible commands
generalises because every input is text the frozen encoder already understands.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.agent.features import CachedEncoder, Decision, Design, Featurizer
from components.agent.policy import Decision as Answer
from components.agent.policy import Observation, PolicySettings
from components.agent.policy_base import ActResult, TokenScores, TrainablePolicy, frozen
from components.io import read_json

if TYPE_CHECKING:
    import torch

SCORER_FILE = "scorer.json"  # marks a saved scoring policy (and holds its settings)
WEIGHTS_FILE = "scorer.pt"
SCORER_KIND = "scorer"


@dataclass(frozen=True)
class ScorerSettings:
    """Shape of a scoring policy (saved with it; a loaded policy rebuilds the same one)."""

    embedder: str = "wordllama"  # components/buffer/embedders.py names
    dim: int = 128  # embedding width kept (Matryoshka truncation)
    hidden: int = 256
    design: Design = "full"
    max_steps: int = 30  # the env's step limit (a feature is the share of it used)
    page: bool = False  # web-page env: page scalars per command (features.py)


def build_net(candidate_dim: int, context_dim: int, hidden: int) -> torch.nn.Module:
    """The scoring head: context MLP + candidate projection -> score; a value head for PPO."""
    import torch
    from torch import nn

    class ScorerNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.context = nn.Sequential(nn.Linear(context_dim, hidden), nn.Tanh())
            self.candidate = nn.Linear(candidate_dim, hidden)
            self.score = nn.Sequential(
                nn.Tanh(), nn.Linear(hidden, hidden // 2), nn.Tanh(), nn.Linear(hidden // 2, 1)
            )
            self.hidden_size = context_dim + hidden

        def forward(
            self, cand: torch.Tensor, ctx: torch.Tensor, mask: torch.Tensor
        ) -> tuple[torch.Tensor, torch.Tensor]:
            """Logits [B, K] (padding at -1e9) and the pooled state features [B, H]."""
            h = self.context(ctx)
            z = self.candidate(cand) + h.unsqueeze(1)
            logits = self.score(z).squeeze(-1).masked_fill(mask == 0, -1e9)
            pooled = (torch.tanh(z) * mask.unsqueeze(-1)).sum(1)
            pooled = pooled / mask.sum(1, keepdim=True).clamp(min=1.0)
            return logits, torch.cat([ctx, pooled], dim=-1)

    return ScorerNet()


def collate(decisions: Sequence[Decision]) -> tuple[Any, Any, Any]:
    """Pad decisions to ``[B, K, F]`` candidates, ``[B, F']`` contexts and a ``[B, K]`` mask."""
    import numpy as np
    import torch

    k = max(len(d.commands) for d in decisions)
    width = decisions[0].candidates.shape[1]
    cand = np.zeros((len(decisions), k, width), np.float32)
    mask = np.zeros((len(decisions), k), np.float32)
    for i, d in enumerate(decisions):
        cand[i, : len(d.commands)] = d.candidates
        mask[i, : len(d.commands)] = 1.0
    ctx = np.stack([d.context for d in decisions])
    return torch.from_numpy(cand), torch.from_numpy(ctx), torch.from_numpy(mask)


class ScorerPolicy(TrainablePolicy):
    """Softmax over admissible commands (see the module docstring)."""

    kind = SCORER_KIND
    is_lora = False

    def __init__(
        self,
        settings: ScorerSettings,
        *,
        encoder: CachedEncoder | None = None,
        net: torch.nn.Module | None = None,
        seed: int = 0,
        score_batch_size: int = 256,
    ) -> None:
        import torch

        from components.buffer.embedders import make_embedder
        from components.config import BufferConfig

        self.scorer_settings = settings
        if encoder is None:
            embedder = make_embedder(BufferConfig(embedder=settings.embedder))
            encoder = CachedEncoder(embedder, settings.dim)
        self.encoder = encoder
        self.featurizer = Featurizer(
            encoder, settings.max_steps, settings.design, page=settings.page
        )
        if net is None:
            torch.manual_seed(seed)
            f = self.featurizer
            net = build_net(f.candidate_dim, f.context_dim, settings.hidden)
        self.model = net
        self.score_batch_size = score_batch_size
        # what the LM policies call their prompt settings: here only the history length
        # matters to callers (evaluation replays whole episodes anyway)
        self.settings = PolicySettings(history_len=0, with_reasoning=False)

    # -- the interface RL, SFT and evaluation use (shared with PolicyModel) -----------------

    @property
    def device(self) -> torch.device:
        """Always the CPU: the head is tiny."""
        import torch

        return torch.device("cpu")

    @property
    def hidden_size(self) -> int:
        """Width of the state features a value head reads."""
        return int(self.model.hidden_size)

    def frozen_copy(self) -> ScorerPolicy:
        """An independent frozen copy (the KL reference), sharing the encoder cache."""
        return ScorerPolicy(self.scorer_settings, encoder=self.encoder, net=frozen(self.model))

    def decide(self, observations: Sequence[Observation]) -> list[Decision]:
        """The features of each observation's admissible commands."""
        return [self.featurizer.decide(o) for o in observations]

    def act(
        self,
        observations: Sequence[Observation],
        *,
        temperature: float = 1.0,
        max_new_tokens: int = 0,
        with_logprobs: bool = True,
    ) -> list[ActResult]:
        """Sample a command per observation (``temperature == 0``: the best-scored one)."""
        import torch

        del max_new_tokens, with_logprobs  # one "token" per decision, always scored
        if not observations:
            return []
        decisions = self.decide(observations)
        with torch.no_grad():
            logits, _ = self.model(*collate(decisions))
            if temperature > 0:
                logp = torch.log_softmax(logits / temperature, dim=-1)
                choice = torch.multinomial(logp.exp(), 1).squeeze(1)
            else:
                logp = torch.log_softmax(logits, dim=-1)
                choice = logp.argmax(-1)
            chosen = logp.gather(1, choice.unsqueeze(1)).squeeze(1)
        out = []
        for d, c, lp in zip(decisions, choice.tolist(), chosen.tolist(), strict=True):
            action = d.commands[c]
            out.append(ActResult(action, action, Answer(action, None), None, (), (c,), (lp,), d))
        return out

    def _score(
        self, acts: Sequence[ActResult], temperature: float, with_entropy: bool, with_hidden: bool
    ) -> TokenScores:
        """Log-probabilities (gradients follow torch's mode) of the chosen commands, as
        one-token completions: ``logprobs``/``mask``/``entropy`` are ``[B, 1]``."""
        import torch

        cand, ctx, mask = collate([a.features for a in acts])
        logits, hidden = self.model(cand, ctx, mask)
        logp_all = torch.log_softmax(logits / temperature, dim=-1)
        choice = torch.tensor([a.completion_ids[0] for a in acts])
        logp = logp_all.gather(1, choice.unsqueeze(1))
        entropy = None
        if with_entropy:
            p = logp_all.exp() * mask
            entropy = -(p * logp_all.masked_fill(mask == 0, 0.0)).sum(-1, keepdim=True)
        return TokenScores(
            logprobs=logp,
            mask=torch.ones_like(logp),
            entropy=entropy,
            last_hidden=hidden if with_hidden else None,
        )

    def act_logprobs(
        self, acts: Sequence[ActResult], temperature: float = 1.0
    ) -> list[tuple[float, ...]]:
        """Log-probability of each decision's chosen command (no gradients)."""
        import torch

        out: list[tuple[float, ...]] = []
        with torch.no_grad():
            for start in range(0, len(acts), self.score_batch_size):
                scores = self.score(acts[start : start + self.score_batch_size], temperature)
                out.extend((v,) for v in scores.logprobs.squeeze(1).tolist())
        return out

    # -- saving ------------------------------------------------------------------------------

    def save(self, out_dir: Path) -> None:
        """Weights + settings; ``ScorerPolicy.load`` rebuilds the same policy."""
        import torch

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        torch.save(self.model.state_dict(), out_dir / WEIGHTS_FILE)
        (out_dir / SCORER_FILE).write_text(
            json.dumps(asdict(self.scorer_settings), indent=2), encoding="utf-8"
        )

    @classmethod
    def load(cls, path: Path, encoder: CachedEncoder | None = None) -> ScorerPolicy:
        """A saved scoring policy."""
        import torch

        path = Path(path)
        settings = ScorerSettings(**read_json(path / SCORER_FILE))
        policy = cls(settings, encoder=encoder)
        state = torch.load(path / WEIGHTS_FILE, map_location="cpu", weights_only=True)
        policy.model.load_state_dict(state)
        policy.model.eval()
        return policy


def is_scorer_dir(path: Path) -> bool:
    """``path`` holds a saved scoring policy."""
    return (Path(path) / SCORER_FILE).exists()
