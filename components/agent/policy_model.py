"""The agent's policy as a causal LM: sample answers for observations, score completions.

``PolicyModel.act`` renders each Observation with the policy prompt (policy.py), samples
an answer with the fast batched ``Generator`` (components/lm/generate.py: KV-cache decode
loop on CPU, static cache + torch.compile on CUDA) that stops at ``</action>`` (or eos, or
``max_new_tokens``), parses it strictly and returns, per decision, the prompt token ids,
the completion token ids and their log-probabilities. ``sequence_logprobs`` scores given
completions under the current weights (with gradients when enabled): the RL losses use it.

Malformed answers never crash a rollout: the env receives ``MALFORMED_ACTION`` ("noop",
policy_base.py) and takes its invalid-action path. The completion is still trained on
with the episode's reward, so the policy learns the format from the outcome.

Log-probabilities are those of the *tempered* policy, log softmax(logits / temperature),
the distribution the tokens were sampled from (as TRL's GRPOTrainer does).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from components.agent.policy import (
    ACTION_STOP,
    Observation,
    PolicySettings,
    render_prompt,
)
from components.agent.policy_base import (
    MALFORMED_ACTION,
    ActResult,
    TokenScores,
    TrainablePolicy,
    frozen,
    parse_policy_answer,
)
from components.io import read_json

if TYPE_CHECKING:
    import torch

    from components.lm.generate import CompletionBackend, Generator

SETTINGS_FILE = "policy_settings.json"


class PolicyModel(TrainablePolicy):
    """A causal LM + tokenizer answering in the policy format."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        settings: PolicySettings | None = None,
        *,
        gen_batch_size: int = 16,
        score_batch_size: int = 16,
        backend: CompletionBackend | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.settings = settings or PolicySettings()
        self.gen_batch_size = gen_batch_size
        self.score_batch_size = score_batch_size
        if tokenizer.padding_side != "left":
            tokenizer.padding_side = "left"  # batched prompts are left-padded
        self.pad_id = (
            tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        )
        self.stop_id = _single_token_id(tokenizer, ACTION_STOP)
        self._generator: Generator | None = None
        # a server with these weights (serving.policy_backend openai): ``act`` decodes there
        self.backend = backend

    # -- construction and saving -----------------------------------------------------------

    @classmethod
    def from_dir(cls, path: Path, settings: PolicySettings | None = None, **kw: Any) -> PolicyModel:
        """A saved policy (or any saved causal LM + tokenizer directory)."""

        from components.lm.models import load_pretrained_dir

        model, tokenizer = load_pretrained_dir(Path(path))
        stamp = Path(path) / SETTINGS_FILE
        if settings is None and stamp.exists():
            settings = PolicySettings(**read_json(stamp))
        return cls(model, tokenizer, settings, **kw)

    @classmethod
    def tiny(
        cls,
        texts: Sequence[str],
        preset: str = "nano",
        vocab_size: int = 512,
        settings: PolicySettings | None = None,
        seed: int = 0,
        **kw: Any,
    ) -> PolicyModel:
        """A from-scratch tiny Llama with a tokenizer trained on ``texts`` (tests, ci)."""
        from components.lm.models import build_tiny_model
        from components.lm.tokenizer import train_tokenizer

        tokenizer = train_tokenizer(texts, vocab_size=vocab_size)
        model = build_tiny_model(preset, tokenizer, seed=seed)
        return cls(model, tokenizer, settings, **kw)

    @classmethod
    def from_hub(
        cls,
        name: str,
        settings: PolicySettings | None = None,
        lora: LoraSettings | None = None,
        **kw: Any,
    ) -> PolicyModel:
        """A hub causal LM by name (gpu profile), optionally with fresh LoRA adapters."""
        import torch

        from components.lm.models import load_hub_model

        model, tokenizer = load_hub_model(name)
        if torch.cuda.is_available():
            model = model.to("cuda")
        policy = cls(model, tokenizer, settings, **kw)
        if lora is not None:
            policy.add_lora(lora)
        return policy

    def enable_gradient_checkpointing(self) -> None:
        """Recompute activations in training-mode backward passes (rollouts are unchanged)."""
        # non-reentrant: works with frozen embeddings (LoRA) without enable_input_require_grads;
        # transformers 5.x renamed the switch (the old name warns, older releases lack the new)
        kwargs = {"use_reentrant": False}
        if hasattr(self.model, "activation_checkpointing_enable"):
            self.model.activation_checkpointing_enable(activation_checkpointing_kwargs=kwargs)
        else:
            self.model.gradient_checkpointing_enable(gradient_checkpointing_kwargs=kwargs)

    @property
    def checkpoints_activations(self) -> bool:
        """Whether training-mode backward passes recompute activations."""
        flag = getattr(self.model, "is_activation_checkpointing", None)
        if flag is None:
            flag = self.model.is_gradient_checkpointing
        return bool(flag)

    def add_lora(self, lora: LoraSettings, seed: int | None = None) -> None:
        """Wrap the model with LoRA adapters: only they train; the frozen base is the reference.

        ``seed``: the adapters' init draws from a torch RNG seeded with it (forked: the
        global stream is left as it was); None draws from the global RNG.
        """
        import torch
        from peft import LoraConfig, get_peft_model

        config = LoraConfig(
            r=lora.r,
            lora_alpha=lora.alpha,
            lora_dropout=lora.dropout,
            target_modules="all-linear",
            task_type="CAUSAL_LM",
        )
        if seed is None:
            self.model = get_peft_model(self.model, config)
            return
        # peft fills lora_A from the global RNG, whose state depends on what ran before
        with torch.random.fork_rng():
            torch.manual_seed(seed)
            self.model = get_peft_model(self.model, config)

    @property
    def is_lora(self) -> bool:
        """The model carries LoRA adapters (peft)."""
        return hasattr(self.model, "disable_adapter")

    def save(self, out_dir: Path) -> None:
        """Save a plain model directory (LoRA merged) that ``from_dir`` and evaluators load."""
        import json
        from dataclasses import asdict

        out_dir = Path(out_dir)
        out_dir.mkdir(parents=True, exist_ok=True)
        model = copy.deepcopy(self.model).merge_and_unload() if self.is_lora else self.model
        model.save_pretrained(str(out_dir))
        self.tokenizer.save_pretrained(str(out_dir))
        (out_dir / SETTINGS_FILE).write_text(json.dumps(asdict(self.settings)), encoding="utf-8")

    @property
    def device(self) -> torch.device:
        """Where the weights live."""
        return next(self.model.parameters()).device

    def frozen_copy(self) -> PolicyModel:
        """An independent frozen copy (the KL reference of a full fine-tune)."""
        return PolicyModel(
            frozen(self.model),
            self.tokenizer,
            self.settings,
            gen_batch_size=self.gen_batch_size,
            score_batch_size=self.score_batch_size,
        )

    # -- prompts and sampling --------------------------------------------------------------

    def prompt_texts(self, observations: Sequence[Observation]) -> list[str]:
        """The chat-rendered prompts (with the assistant generation prompt)."""
        return [
            self.tokenizer.apply_chat_template(
                render_prompt(obs, self.settings), tokenize=False, add_generation_prompt=True
            )
            for obs in observations
        ]

    def prompt_ids(self, observations: Sequence[Observation]) -> list[list[int]]:
        """Token ids of the chat-rendered prompts (with the assistant generation prompt)."""
        return [self._encode(text) for text in self.prompt_texts(observations)]

    def _encode(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def act(
        self,
        observations: Sequence[Observation],
        *,
        temperature: float = 1.0,
        max_new_tokens: int = 64,
        with_logprobs: bool = True,
    ) -> list[ActResult]:
        """Sample (temperature > 0) or greedily pick one answer per observation."""
        if not observations:
            return []
        texts = self.prompt_texts(observations)
        prompts = [self._encode(t) for t in texts]
        if self.backend is None:
            completions, logprobs = self.generate_ids(
                prompts, temperature, max_new_tokens, with_logprobs=with_logprobs
            )
        else:  # a server with these weights (components/agent/policy_served.py)
            from components.agent.policy_served import served_ids

            completions, logprobs = served_ids(
                self, texts, prompts, temperature, max_new_tokens, with_logprobs=with_logprobs
            )
        results = []
        for p, c, lp in zip(prompts, completions, logprobs, strict=True):
            text = self.tokenizer.decode(c, skip_special_tokens=True)
            decision, error = parse_policy_answer(text, self.settings.with_reasoning)
            action = decision.action if decision is not None else MALFORMED_ACTION
            results.append(ActResult(action, text, decision, error, tuple(p), tuple(c), lp))
        return results

    def generate_ids(
        self,
        prompts: Sequence[Sequence[int]],
        temperature: float,
        max_new_tokens: int,
        *,
        with_logprobs: bool = False,
    ) -> tuple[list[list[int]], list[tuple[float, ...]]]:
        """Completion ids per prompt, cut after ``</action>`` or eos (both kept), and their
        log-probs (empty tuples unless ``with_logprobs``).

        Decoded by the fast batched ``Generator`` (components/lm/generate.py). The log-probs
        come from the logits it sampled from (log softmax(logits / T); T = 1 for greedy), so
        no second forward pass is needed on CPU; they equal ``sequence_logprobs`` of the
        same tokens up to float rounding (tested). Without a seed, sampling draws from
        torch's global RNG, which the RL loop seeds per round (resumable runs).
        """
        done = self.generator.complete_ids(
            prompts,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=1.0,
            stop=(ACTION_STOP,),
            batch_size=self.gen_batch_size,
            logprobs=with_logprobs,
        )
        return [list(c.token_ids) for c in done], [c.logprobs for c in done]

    @property
    def generator(self) -> Generator:
        """The batched generator over the current model (rebuilt after ``add_lora``)."""
        from components.lm.generate import Generator

        if self._generator is None or self._generator.model is not self.model:
            self._generator = Generator(self.model, self.tokenizer)
        return self._generator

    # -- scoring -----------------------------------------------------------------------------

    def _score(
        self, acts: Sequence[ActResult], temperature: float, with_entropy: bool, with_hidden: bool
    ) -> TokenScores:
        """Per-token scores of the decisions' completions (``sequence_logprobs``)."""
        return self.sequence_logprobs(
            [a.prompt_ids for a in acts],
            [a.completion_ids for a in acts],
            temperature,
            with_entropy=with_entropy,
            with_hidden=with_hidden,
        )

    def act_logprobs(
        self, acts: Sequence[ActResult], temperature: float = 1.0
    ) -> list[tuple[float, ...]]:
        """Per-token log-probabilities of sampled decisions (no gradients)."""
        return self.completion_logprobs(
            [a.prompt_ids for a in acts], [a.completion_ids for a in acts], temperature
        )

    @property
    def hidden_size(self) -> int:
        """Width of the hidden state a value head reads."""
        return int(self.model.config.get_text_config().hidden_size)

    def completion_logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float = 1.0,
    ) -> list[tuple[float, ...]]:
        """Log-probabilities of each completion token (no gradients), in input order."""
        import torch

        out: list[tuple[float, ...]] = []
        with torch.no_grad():
            for start in range(0, len(prompts), self.score_batch_size):
                end = start + self.score_batch_size
                scores = self.sequence_logprobs(
                    prompts[start:end], completions[start:end], temperature
                )
                for row, mask in zip(scores.logprobs.tolist(), scores.mask.tolist(), strict=True):
                    out.append(tuple(v for v, m in zip(row, mask, strict=True) if m > 0))
        return out

    def sequence_logprobs(
        self,
        prompts: Sequence[Sequence[int]],
        completions: Sequence[Sequence[int]],
        temperature: float = 1.0,
        *,
        with_entropy: bool = False,
        with_hidden: bool = False,
    ) -> TokenScores:
        """Score completions given prompts in one forward pass (gradients follow torch's mode).

        Layout: ``[left pad | prompt | completion | right pad]``; position ids count real
        tokens only, as in generation, so scores match what was sampled.
        """
        import torch

        p_width = max(len(p) for p in prompts)
        c_width = max(1, max(len(c) for c in completions))
        rows, att, cmask = [], [], []
        for p, c in zip(prompts, completions, strict=True):
            lpad, rpad = p_width - len(p), c_width - len(c)
            rows.append([self.pad_id] * lpad + list(p) + list(c) + [self.pad_id] * rpad)
            att.append([0] * lpad + [1] * (len(p) + len(c)) + [0] * rpad)
            cmask.append([1.0] * len(c) + [0.0] * rpad)
        device = self.device
        ids = torch.tensor(rows, dtype=torch.long, device=device)
        attention = torch.tensor(att, dtype=torch.long, device=device)
        mask = torch.tensor(cmask, dtype=torch.float32, device=device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=ids,
            attention_mask=attention,
            position_ids=positions,
            logits_to_keep=c_width + 1,  # the last prompt position predicts the first token
            output_hidden_states=with_hidden,
            use_cache=False,
        )
        logits = out.logits[:, :-1, :].float() / temperature
        logp_all = torch.log_softmax(logits, dim=-1)
        targets = ids[:, p_width:]
        logprobs = logp_all.gather(-1, targets.unsqueeze(-1)).squeeze(-1) * mask
        entropy = None
        if with_entropy:
            entropy = -(logp_all.exp() * logp_all).sum(-1) * mask
        hidden = out.hidden_states[-1][:, p_width - 1, :] if with_hidden else None
        return TokenScores(logprobs=logprobs, mask=mask, entropy=entropy, last_hidden=hidden)


@dataclass(frozen=True)
class LoraSettings:
    """LoRA adapter sizes (gpu profile)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.0


def _single_token_id(tokenizer: Any, text: str) -> int | None:
    """The id of ``text`` when the tokenizer encodes it as exactly one token."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids[0] if len(ids) == 1 else None
