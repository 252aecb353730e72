"""The offline baselines of Table 1: SFT (behaviour cloning) and DPO, with TRL.

``train_sft_policy`` runs the experience model's SFT machinery
(components/experience/sft.py: TRL SFTTrainer, completion-only loss, length fitting,
fingerprinted checkpoints that resume, a wall-clock budget) on policy examples.
``train_dpo_policy`` runs TRL's DPOTrainer from the SFT policy, which is also the frozen
reference (a copy; with LoRA the adapter-free base plays that role). Base models per
profile as for the experience model: ``tiny`` (from a config, tokenizer trained on the
train-split SFT data), ``smollm2`` (packaged) or a hub name (gpu profile, LoRA optional).

A saved policy is a plain model directory (LoRA merged) with ``policy_settings.json``
(the prompt shape, read by PolicyModel.from_dir and the evaluator) and ``policy.json``
(method, base model, the real interactions its training used).
"""

from __future__ import annotations

import json
import logging
import shutil
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from components.agent.dpo_data import PreferencePair
from components.agent.policy import PolicySettings
from components.agent.policy_model import SETTINGS_FILE
from components.agent.sft_data import PolicyExample
from components.config import AgentConfig, ExperienceConfig
from components.config.base import fields_of
from components.io import read_json

log = logging.getLogger(__name__)

META_FILE = "policy.json"
# the agent's settings handed on under the same names: the prompt shape (PolicySettings),
# the base model and the SFT run (ExperienceConfig, which components/experience/sft.py trains)
PROMPT_FIELDS = ["history_len", "with_reasoning", "show_admissible", "max_admissible"]
MODEL_FIELDS = [
    "model",
    "tiny_preset",
    "vocab_size",
    "max_length",
    "bf16",
    "lora",
    "lora_r",
    "lora_alpha",
    "seed",
]
SFT_FIELDS = [
    "epochs",
    "max_steps",
    "max_train_minutes",
    "learning_rate",
    "batch_size",
    "grad_accum",
    "warmup_ratio",
    "weight_decay",
    "logging_steps",
    "save_steps",
]


def policy_settings(acfg: AgentConfig) -> PolicySettings:
    """The prompt shape a policy is trained and evaluated with."""
    return PolicySettings(**fields_of(acfg, *PROMPT_FIELDS))


def plain_forward(model: Any) -> Any:
    """``model`` without the forward wrappers TRL/accelerate set on the instance.

    TRL's trainers replace ``model.forward`` by a closure over the *original* object's
    forward (fused LM head); a deepcopy of such a model (a DPO reference, an RL frozen
    copy) would silently run the original's weights. Dropping the instance attribute
    restores the class's forward.
    """
    for attr in ("forward", "_original_forward"):
        model.__dict__.pop(attr, None)
    return model


def sft_train_config(acfg: AgentConfig) -> ExperienceConfig:
    """The agent's SFT knobs in the shape components/experience/sft.py trains with."""
    return ExperienceConfig(**fields_of(acfg, *MODEL_FIELDS), **fields_of(acfg.sft, *SFT_FIELDS))


def load_base_policy(
    acfg: AgentConfig, texts: Sequence[str], base_cache: Path, tokenizer_dir: Path
) -> tuple[Any, Any]:
    """The base model and tokenizer named by ``agent.model``.

    ``tiny`` trains its tokenizer on ``texts`` (train-split SFT data only) and keeps it in
    ``tokenizer_dir`` (next to the checkpoints: a resumed run needs the same vocabulary).
    """
    from components.lm.models import load_base

    return load_base(acfg, lambda: texts, base_cache=base_cache, tokenizer_dir=tokenizer_dir)


def train_sft_policy(
    model: Any,
    tokenizer: Any,
    examples: Sequence[PolicyExample],
    acfg: AgentConfig,
    checkpoint_dir: Path,
    *,
    fingerprint: dict[str, Any],
    eval_examples: Sequence[PolicyExample] = (),
) -> tuple[Any, Any]:
    """Behaviour cloning with TRL's SFTTrainer (loss on the answer only); (model, SFTResult)."""
    from components.experience.sft import train_sft

    # sft.py is typed for experience examples; policy examples have the same interface
    trained, result = train_sft(
        model,
        tokenizer,
        examples,  # type: ignore[arg-type]
        sft_train_config(acfg),
        checkpoint_dir,
        fingerprint=fingerprint,
        eval_examples=eval_examples,  # type: ignore[arg-type]
    )
    return plain_forward(trained), result


@dataclass(frozen=True)
class DPOResult:
    """What a DPO run did."""

    steps: int
    seconds: float
    n_pairs: int
    n_dropped_too_long: int
    train_loss: float | None
    first_loss: float | None
    last_loss: float | None
    first_accuracy: float | None  # share of pairs whose implicit reward prefers chosen
    last_accuracy: float | None
    last_margin: float | None  # mean implicit reward margin chosen - rejected
    resumed_from: str | None
    stopped_by_time_budget: bool
    log_history: list[dict[str, Any]] = field(default_factory=list)

    def metrics(self) -> dict[str, float | int]:
        """The numeric summary (for metrics files and MLflow)."""
        from components.lm.training import run_metrics

        counts = {"n_pairs": self.n_pairs, "n_dropped_too_long": self.n_dropped_too_long}
        losses = (
            "train_loss",
            "first_loss",
            "last_loss",
            "first_accuracy",
            "last_accuracy",
            "last_margin",
        )
        return run_metrics(self, counts, losses)


def pair_length(tokenizer: Any, pair: PreferencePair) -> int:
    """Tokens of prompt + the longer answer, chat template applied."""
    record = pair.to_dpo()
    return max(
        len(
            tokenizer(
                tokenizer.apply_chat_template(record["prompt"] + record[side], tokenize=False),
                add_special_tokens=False,
            )["input_ids"]
        )
        for side in ("chosen", "rejected")
    )


def fit_pairs(
    tokenizer: Any, pairs: Sequence[PreferencePair], max_length: int
) -> tuple[list[PreferencePair], int]:
    """Pairs that fit ``max_length`` whole, and how many were dropped (never truncated)."""
    kept = [p for p in pairs if pair_length(tokenizer, p) <= max_length]
    return kept, len(pairs) - len(kept)


def make_dpo_trainer(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    acfg: AgentConfig,
    checkpoint_dir: Path,
) -> tuple[Any, int]:
    """A DPOTrainer on the pairs that fit ``max_length``, and how many were dropped."""
    import copy

    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    from components.experience.sft import _time_budget_callback
    from components.lm.training import lora_config, trainer_args

    d = acfg.dpo
    kept, dropped = fit_pairs(tokenizer, pairs, acfg.max_length)
    if not kept:
        raise ValueError(f"no preference pair fits max_length={acfg.max_length}")
    if dropped:
        log.warning(
            "%d of %d pairs over max_length=%d dropped", dropped, len(pairs), acfg.max_length
        )
    args = DPOConfig(
        **trainer_args(str(checkpoint_dir), d, acfg),
        beta=d.beta,
        # RPO: TRL adds the chosen completion's NLL as the "sft" loss term
        loss_type=[d.loss_type, "sft"] if d.sft_weight > 0 else [d.loss_type],
        loss_weights=[1.0, d.sft_weight] if d.sft_weight > 0 else None,
    )
    peft_config = ref_model = None
    if acfg.lora:
        # the adapter-free base is the reference: no second copy of a large model
        peft_config = lora_config(acfg.lora_r, acfg.lora_alpha)
    else:
        # an explicit frozen copy: TRL would otherwise reload the model by its hub name,
        # which a from-scratch model does not have
        ref_model = copy.deepcopy(plain_forward(model)).eval()
    trainer = DPOTrainer(
        model=model,
        ref_model=ref_model,
        args=args,
        train_dataset=Dataset.from_list([p.to_dpo() for p in kept]),
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[_time_budget_callback(d.max_train_minutes)],
    )
    return trainer, dropped


def train_dpo_policy(
    model: Any,
    tokenizer: Any,
    pairs: Sequence[PreferencePair],
    acfg: AgentConfig,
    checkpoint_dir: Path,
    *,
    fingerprint: dict[str, Any],
) -> tuple[Any, DPOResult]:
    """DPO from ``model`` (the SFT policy, also the reference); resumes a same-fingerprint run."""
    from components.experience.sft import prepare_checkpoints
    from components.lm.training import first_last, run_fields, timed_train

    resume = prepare_checkpoints(checkpoint_dir, fingerprint)
    trainer, dropped = make_dpo_trainer(model, tokenizer, pairs, acfg, checkpoint_dir)
    output, seconds, stopped = timed_train(trainer, resume, "DPO")
    trained = trainer.model
    if acfg.lora:
        trained = trained.merge_and_unload()  # a plain model: inference needs no peft
    trained = plain_forward(trained)
    history = trainer.state.log_history
    first_acc, last_acc = first_last(history, "rewards/accuracies")
    result = DPOResult(
        n_pairs=len(trainer.train_dataset),
        n_dropped_too_long=dropped,
        first_accuracy=first_acc,
        last_accuracy=last_acc,
        last_margin=first_last(history, "rewards/margins")[1],
        **run_fields(trainer, output, seconds, resume, stopped),
    )
    return trained, result


def save_policy(
    model: Any, tokenizer: Any, out_dir: Path, settings: PolicySettings, meta: dict[str, Any]
) -> None:
    """Save weights, tokenizer, prompt settings and metadata (atomically replaces out_dir)."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    (tmp / SETTINGS_FILE).write_text(json.dumps(asdict(settings)), encoding="utf-8")
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)  # never leave a half-written policy behind


def load_settings(policy_dir: Path) -> PolicySettings:
    """The prompt settings a saved policy was trained with."""
    path = policy_dir / SETTINGS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: train the policy first")
    return PolicySettings(**read_json(path))


def load_meta(policy_dir: Path) -> dict[str, Any]:
    """The metadata saved with a policy (empty if it has none)."""
    path = policy_dir / META_FILE
    return read_json(path) if path.exists() else {}
