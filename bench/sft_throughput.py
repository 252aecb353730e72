"""SFT training throughput of the cpu experience model's preset: a few TRL steps on the
pipeline's real training prompts, tokens/s of ``trainer.train``. ``bench.generation`` runs
it and records it as ``sft_training`` in bench/results/generation.json.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

SFT_STEPS = int(os.environ.get("BENCH_GEN_SFT_STEPS", "6"))


def measure_sft() -> dict[str, Any]:
    """SFT training tokens/s of the cpu experience model's preset (a few TRL steps)."""
    from components.config import PARAMS_FILE, Paths, load_config
    from components.experience.dataset import build_examples, corpus, select_transitions
    from components.experience.sft import train_sft
    from components.lm.models import build_tiny_model
    from components.lm.tokenizer import train_tokenizer
    from components.stages.experience import load_trajectories, open_retriever, prompt_settings
    from components.teacher.annotate import load_annotations

    cfg = load_config(PARAMS_FILE, profile="cpu")
    ecfg = cfg.experience.model_copy(
        update={
            "max_steps": SFT_STEPS,
            "max_train_minutes": None,
            "save_steps": 10_000,
            "eval_loss_examples": 0,
            "logging_steps": 1,
        }
    )
    paths = Paths(Path(".").resolve())
    settings = prompt_settings(cfg)
    n = SFT_STEPS * ecfg.batch_size * ecfg.grad_accum
    train, _ = build_examples(
        select_transitions(load_trajectories(paths), "train", n, ecfg.seed),
        settings,
        load_annotations(paths.annotations_file),
        open_retriever(cfg, paths, settings.k),
    )
    tok = train_tokenizer(corpus(train), vocab_size=ecfg.vocab_size)
    model = build_tiny_model(ecfg.tiny_preset, tok)
    # tokens trained on: prompt + completion of every example seen (one epoch of them)
    n_tokens = 0
    for ex in train:
        text = tok.apply_chat_template(ex.prompt() + ex.to_sft()["completion"], tokenize=False)
        n_tokens += len(tok(text, add_special_tokens=False)["input_ids"])
    with tempfile.TemporaryDirectory() as tmp:
        _, result = train_sft(model, tok, train, ecfg, Path(tmp), fingerprint={"bench": 1})
    return {
        "preset": ecfg.tiny_preset,
        "steps": result.steps,
        "examples": len(train),
        "tokens": n_tokens,
        "seconds": round(result.seconds, 2),
        "tokens_per_s": round(n_tokens / result.seconds, 1),
        "note": "trainer.train wall time incl. the first step's warm-up; batch "
        f"{ecfg.batch_size}, torch threads {_threads()}",
    }


def _threads() -> int:
    import torch

    return torch.get_num_threads()
