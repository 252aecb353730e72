"""What every TRL trainer here shares: the CPU-friendly training arguments and LoRA config."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Sequence
from typing import Any

log = logging.getLogger(__name__)


def use_bf16(setting: bool | None) -> bool:
    """bf16 autocast: as configured, else on a CUDA GPU that supports it.

    Not on CPU by default: even with avx512_bf16 (bf16 matmuls 3.6x faster than fp32 on
    the dev machine), SFT steps measured no faster (tiny Llama 10.6 vs 9.4 s/step,
    SmolLM2 53 vs 50 s/example): elementwise ops and the vocabulary-sized logits dominate.
    """
    import torch

    if setting is not None:
        return setting
    return torch.cuda.is_available() and torch.cuda.is_bf16_supported()


def trainer_args(output_dir: str, schedule: Any, model: Any) -> dict[str, Any]:
    """Keyword arguments common to our TRL configs (SFTConfig, DPOConfig).

    ``schedule`` holds the run's max_steps, epochs, batch_size, grad_accum, learning_rate,
    warmup_ratio, logging_steps and save_steps (an ExperienceConfig, the agent's DPO part),
    ``model`` its max_length, bf16 and seed (the experience or agent config).
    """
    max_length, bf16, seed = model.max_length, model.bf16, model.seed
    import torch

    return {
        "output_dir": output_dir,
        "max_steps": schedule.max_steps,
        "num_train_epochs": schedule.epochs,
        "per_device_train_batch_size": schedule.batch_size,
        "gradient_accumulation_steps": schedule.grad_accum,
        "learning_rate": schedule.learning_rate,
        "lr_scheduler_type": "cosine",
        "warmup_steps": schedule.warmup_ratio,  # a float < 1 is a ratio of the total steps
        "max_length": max_length,
        "activation_checkpointing": False,  # TRL turns it on by default; pure cost on CPU
        "bf16": use_bf16(bf16),
        "use_cpu": not torch.cuda.is_available(),
        "logging_steps": schedule.logging_steps,
        "save_strategy": "steps",
        "save_steps": schedule.save_steps,
        "save_total_limit": 1,  # resuming needs only the last checkpoint
        "eval_strategy": "no",
        "report_to": "none",  # the stages log to MLflow themselves
        "disable_tqdm": not sys.stderr.isatty(),  # a bar in a terminal; logs/CI stay clean
        "dataloader_num_workers": 0,
        "seed": seed,
        "data_seed": seed,
    }


def lora_config(r: int, alpha: int, dropout: float = 0.05) -> Any:
    """PEFT LoRA on every linear layer of a causal LM."""
    from peft import LoraConfig

    return LoraConfig(
        r=r,
        lora_alpha=alpha,
        lora_dropout=dropout,
        target_modules="all-linear",
        task_type="CAUSAL_LM",
    )


def timed_train(trainer: Any, resume: str | None, what: str) -> tuple[Any, float, bool]:
    """Run ``trainer`` (from checkpoint ``resume``, if any): (its output, the seconds it
    took, whether the time-budget callback stopped it)."""
    budget = next(c for c in trainer.callback_handler.callbacks if hasattr(c, "stopped"))
    if resume:
        log.info("resuming %s from %s", what, resume)
    start = time.perf_counter()
    output = trainer.train(resume_from_checkpoint=resume)
    return output, time.perf_counter() - start, budget.stopped


def first_last(log_history: Sequence[dict[str, Any]], key: str) -> tuple[Any, Any]:
    """The first and last value of ``key`` in the trainer's training-loss log rows (rows
    with a ``loss``); (None, None) if it was never logged."""
    values = [h[key] for h in log_history if "loss" in h and key in h]
    return (values[0], values[-1]) if values else (None, None)


def run_fields(
    trainer: Any, output: Any, seconds: float, resume: str | None, stopped: bool
) -> dict[str, Any]:
    """The fields every training result shares, from a finished ``timed_train`` run."""
    history = trainer.state.log_history
    first_loss, last_loss = first_last(history, "loss")
    return {
        "steps": trainer.state.global_step,
        "seconds": seconds,
        "train_loss": output.training_loss,
        "first_loss": first_loss,
        "last_loss": last_loss,
        "resumed_from": resume,
        "stopped_by_time_budget": stopped,
        "log_history": list(history),
    }


def run_metrics(
    result: Any, counts: dict[str, int], losses: Sequence[str], *, minutes: bool = False
) -> dict[str, float | int]:
    """The numeric summary of a training run (for metrics files and MLflow): its steps and
    seconds (and minutes), ``counts``, resumed / stopped flags, then each of the result's
    ``losses`` fields that is set, rounded."""
    out: dict[str, float | int] = {
        "train_steps": result.steps,
        "train_seconds": round(result.seconds, 2),
    }
    if minutes:
        out["train_minutes"] = round(result.seconds / 60, 3)
    out |= counts
    out["resumed"] = int(result.resumed_from is not None)
    out["stopped_by_time_budget"] = int(result.stopped_by_time_budget)
    for key in losses:
        value = getattr(result, key)
        if value is not None:
            out[key] = round(float(value), 5)
    return out
