"""Supervised fine-tuning of the experience model with TRL's SFTTrainer.

The dataset is conversational prompt/completion, so TRL computes the loss on the answer
only (reasoning + next state + reward + end of turn): the paper's
-log P(R*|...) - log P(s', r|..., R*). Settings are CPU-friendly (no gradient
checkpointing, fp32 on CPU, small batches, length-grouped batches to cut padding).
Training checkpoints go to a directory outside the DVC output, stamped with a
fingerprint of everything that defines the run: an interrupted run with the same
fingerprint resumes from its last checkpoint, a changed one starts over.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.agent.checkpoint import same_run
from components.config import ExperienceConfig
from components.experience.dataset import ExperienceExample
from components.io import read_json
from components.lm.training import (
    lora_config,
    run_fields,
    run_metrics,
    timed_train,
    trainer_args,
)

log = logging.getLogger(__name__)

META_FILE = "experience_model.json"


@dataclass(frozen=True)
class SFTResult:
    """What a training run did."""

    steps: int
    seconds: float
    n_train: int
    n_dropped_too_long: int
    n_fewer_retrieved: int  # fitted to max_length by dropping far neighbours
    train_loss: float | None  # Trainer's mean loss over the run
    first_loss: float | None  # first logged loss
    last_loss: float | None  # last logged loss
    eval_loss: float | None  # teacher-forced loss on validation examples
    resumed_from: str | None
    stopped_by_time_budget: bool
    log_history: list[dict[str, Any]] = field(default_factory=list)

    def metrics(self) -> dict[str, float | int]:
        """The numeric summary (for metrics files and MLflow)."""
        counts = {
            "n_train_examples": self.n_train,
            "n_dropped_too_long": self.n_dropped_too_long,
            "n_fewer_retrieved": self.n_fewer_retrieved,
        }
        losses = ("train_loss", "first_loss", "last_loss", "eval_loss")
        return run_metrics(self, counts, losses, minutes=True)


@dataclass(frozen=True)
class FitStats:
    """How many train examples were dropped / given fewer neighbours to fit max_length."""

    dropped: int
    shrunk: int


def sequence_length(tokenizer: Any, example: ExperienceExample) -> int:
    """Tokens of prompt + answer as TRL will tokenise them (chat template applied)."""
    record = example.to_sft()
    text = tokenizer.apply_chat_template(record["prompt"] + record["completion"], tokenize=False)
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def fit_length(
    tokenizer: Any, examples: Sequence[ExperienceExample], max_length: int
) -> tuple[list[ExperienceExample], int, int]:
    """Examples fitted to ``max_length`` tokens: (kept, dropped, shrunk).

    A too-long example first loses its farthest retrieved transitions (one at a time);
    if it still does not fit it is dropped. Never truncated: TRL cuts the end, which
    would cut the answer and teach the model to stop before closing its tags.
    """
    kept: list[ExperienceExample] = []
    dropped = shrunk = 0
    for ex in examples:
        fitted = ex
        n = len(getattr(ex, "retrieved_ids", ()))  # task-generation examples retrieve nothing
        while sequence_length(tokenizer, fitted) > max_length and n > 0 and ex.context:
            n -= 1
            fitted = ex.with_retrieved(n)
        if sequence_length(tokenizer, fitted) > max_length:
            dropped += 1
            continue
        shrunk += fitted is not ex
        kept.append(fitted)
    return kept, dropped, shrunk


def prepare_checkpoints(checkpoint_dir: Path, fingerprint: dict[str, Any]) -> str | None:
    """Keep checkpoints of the same run (returns the last one), wipe those of another."""
    return last_checkpoint(checkpoint_dir) if same_run(checkpoint_dir, fingerprint) else None


def last_checkpoint(checkpoint_dir: Path) -> str | None:
    """The newest complete ``checkpoint-<step>`` directory, if any."""
    from transformers.trainer_utils import get_last_checkpoint

    return get_last_checkpoint(str(checkpoint_dir)) if checkpoint_dir.exists() else None


def make_trainer(
    model: Any,
    tokenizer: Any,
    train: Sequence[ExperienceExample],
    cfg: ExperienceConfig,
    checkpoint_dir: Path,
    eval_examples: Sequence[ExperienceExample] = (),
) -> tuple[Any, FitStats]:
    """An SFTTrainer on the examples fitted to ``max_length``, and what fitting did."""
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    kept, dropped, shrunk = fit_length(tokenizer, train, cfg.max_length)
    if not kept:
        raise ValueError(f"no train example fits max_length={cfg.max_length}")
    if dropped or shrunk:
        log.warning(
            "of %d train examples over max_length=%d: %d fitted with fewer retrieved "
            "transitions, %d dropped",
            len(train),
            cfg.max_length,
            shrunk,
            dropped,
        )
    eval_kept, _, _ = fit_length(tokenizer, eval_examples, cfg.max_length)
    args = SFTConfig(
        **trainer_args(str(checkpoint_dir), cfg, cfg),
        per_device_eval_batch_size=cfg.batch_size,
        weight_decay=cfg.weight_decay,
        completion_only_loss=True,  # explicit: loss on the answer only
        packing=False,
        train_sampling_strategy="group_by_length",  # less padding per batch
    )
    peft_config = lora_config(cfg.lora_r, cfg.lora_alpha) if cfg.lora else None
    trainer = SFTTrainer(
        model=model,
        args=args,
        train_dataset=Dataset.from_list([ex.to_sft() for ex in kept]),
        eval_dataset=Dataset.from_list([ex.to_sft() for ex in eval_kept]) if eval_kept else None,
        processing_class=tokenizer,
        peft_config=peft_config,
        callbacks=[_time_budget_callback(cfg.max_train_minutes)],
    )
    return trainer, FitStats(dropped=dropped, shrunk=shrunk)


def train_sft(
    model: Any,
    tokenizer: Any,
    train: Sequence[ExperienceExample],
    cfg: ExperienceConfig,
    checkpoint_dir: Path,
    *,
    fingerprint: dict[str, Any],
    eval_examples: Sequence[ExperienceExample] = (),
) -> tuple[Any, SFTResult]:
    """Fine-tune ``model`` on the examples (resuming a same-fingerprint run); LoRA merged."""
    resume = prepare_checkpoints(checkpoint_dir, fingerprint)
    trainer, fit = make_trainer(model, tokenizer, train, cfg, checkpoint_dir, eval_examples)
    output, seconds, stopped = timed_train(trainer, resume, "SFT")
    eval_loss = trainer.evaluate()["eval_loss"] if trainer.eval_dataset is not None else None
    trained = trainer.model
    if cfg.lora:
        trained = trained.merge_and_unload()  # a plain model: inference needs no peft
    result = SFTResult(
        n_train=len(trainer.train_dataset),
        n_dropped_too_long=fit.dropped,
        n_fewer_retrieved=fit.shrunk,
        eval_loss=eval_loss,
        **run_fields(trainer, output, seconds, resume, stopped),
    )
    return trained, result


def completion_loss(model: Any, tokenizer: Any, examples: Sequence[ExperienceExample]) -> float:
    """Mean teacher-forced loss on the answers (prompt tokens masked), one example at a time."""
    import torch

    total, count = 0.0, 0
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.inference_mode():
        for ex in examples:
            record = ex.to_sft()
            prompt = tokenizer.apply_chat_template(
                record["prompt"], tokenize=False, add_generation_prompt=True
            )
            full = tokenizer.apply_chat_template(
                record["prompt"] + record["completion"], tokenize=False
            )
            n_prompt = len(tokenizer(prompt, add_special_tokens=False)["input_ids"])
            ids = torch.tensor([tokenizer(full, add_special_tokens=False)["input_ids"]])
            labels = ids.clone()
            labels[:, :n_prompt] = -100
            out = model(input_ids=ids.to(device), labels=labels.to(device))
            n = int((labels[:, 1:] != -100).sum())
            total += float(out.loss) * n
            count += n
    model.train(was_training)
    return total / max(count, 1)


def _time_budget_callback(minutes: float | None) -> Any:
    """A callback that stops training (with a final save) once the budget is spent."""
    from transformers import TrainerCallback

    class TimeBudget(TrainerCallback):
        def __init__(self) -> None:
            self.deadline: float | None = None
            self.stopped = False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            # counted from the first step, not from dataset tokenisation
            self.deadline = time.monotonic() + minutes * 60 if minutes else None
            return control

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
            if self.deadline is not None and time.monotonic() >= self.deadline:
                log.info("time budget spent at step %d: stopping", state.global_step)
                self.stopped = True
                control.should_training_stop = True
                control.should_save = True
            return control

    return TimeBudget()


def save_model(model: Any, tokenizer: Any, out_dir: Path, meta: dict[str, Any]) -> None:
    """Save model (safetensors), tokenizer and the prompt settings inference must reuse."""
    tmp = out_dir.with_name(out_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    (tmp / META_FILE).write_text(json.dumps(meta, indent=2, sort_keys=True) + "\n")
    shutil.rmtree(out_dir, ignore_errors=True)
    tmp.rename(out_dir)  # never leave a half-written model behind


def load_meta(model_dir: Path) -> dict[str, Any]:
    """The metadata saved with a trained experience model."""
    path = model_dir / META_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path} missing: train the experience model first")
    return read_json(path)
