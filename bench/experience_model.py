"""Which experience model for the cpu profile: from-scratch small Llama vs SmolLM2-135M.

``python -m bench.experience_model [candidate ...]`` trains each candidate with the
cpu-profile data (train split, k neighbours from the replay buffer, teacher reasoning)
for a comparable wall-clock budget on this machine, measures fidelity on the same
held-out validation transitions (greedy decoding) and writes
bench/results/experience_model_choice.json, merging with earlier candidates' results
so candidates can run one at a time. Candidates: ``tiny-<preset>`` or ``smollm2``.
Fidelity per minute = fidelity_score / training minutes, where fidelity_score =
0.5 * (1 - eps_R) + 0.5 * state token F1 (malformed answers score 0 on both).
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import time
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.common import bench_parser

RESULTS = Path("bench/results/experience_model_choice.json")
BUDGET_MINUTES = float(os.environ.get("BENCH_EXPERIENCE_MINUTES", "12"))
EVAL_EXAMPLES = int(os.environ.get("BENCH_EXPERIENCE_EVAL", "200"))
BUFFER = Path(os.environ.get("BENCH_EXPERIENCE_BUFFER", "data/buffer"))
WORK = Path(os.environ.get("BENCH_EXPERIENCE_WORK", "/tmp/dreamgym-bench-experience"))
# Per-candidate training settings: steps sized to the budget from measured step times on
# this machine (the time cap stops a slower run; cosine decay then ends early).
CANDIDATES: dict[str, dict[str, Any]] = {
    # measured: 0.50 s/example (micro), 2.4 s/example (mini), 50 s/example (SmolLM2)
    "tiny-micro": {
        "model": "tiny",
        "tiny_preset": "micro",
        "learning_rate": 2e-3,
        "batch_size": 4,
        "max_steps": 350,
    },
    # the same model with a 2.5x budget: how fidelity scales with training time
    "tiny-micro-30min": {
        "model": "tiny",
        "tiny_preset": "micro",
        "learning_rate": 2e-3,
        "batch_size": 4,
        "max_steps": 900,
        "budget_minutes": 32,
    },
    # compact states: only the changed "Key: value" lines are predicted (state_target)
    "tiny-micro-delta": {
        "model": "tiny",
        "tiny_preset": "micro",
        "state_target": "delta",
        "learning_rate": 2e-3,
        "batch_size": 4,
        "max_steps": 300,
        "budget_minutes": 20,
    },
    "tiny-micro-full": {
        "model": "tiny",
        "tiny_preset": "micro",
        "state_target": "full",
        "learning_rate": 2e-3,
        "batch_size": 4,
        "max_steps": 300,
        "budget_minutes": 20,
    },
    "tiny-micro-delta-long": {
        "model": "tiny",
        "tiny_preset": "micro",
        "state_target": "delta",
        "learning_rate": 2e-3,
        "batch_size": 4,
        "max_steps": 900,
        "budget_minutes": 30,
    },
    "tiny-mini": {
        "model": "tiny",
        "tiny_preset": "mini",
        "learning_rate": 1e-3,
        "batch_size": 4,
        "max_steps": 75,
    },
    "smollm2": {
        "model": "smollm2",
        "learning_rate": 2e-4,
        "batch_size": 1,
        "max_steps": 14,
        "eval_examples": 50,  # ~12 s per answer: 200 would take ~40 min
    },
}


ROW_KEYS = (
    "id",
    "reward_true",
    "reward_pred",
    "reward_error",
    "malformed",
    "error",
    "state_em",
    "state_f1",
    "copy_state_em",
    "copy_state_f1",
    "valid_true",
    "pred_unchanged",
    "bucket_pred",
    "bucket_true",
)


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {}


def run_candidate(name: str) -> dict[str, Any]:
    """Train one candidate for the budget and measure its fidelity."""
    from components.artifacts import base_cache_dir
    from components.buffer import SEED_TAG, ReplayBuffer
    from components.config import PARAMS_FILE, Paths, load_config
    from components.evaluation.fidelity import evaluate_fidelity
    from components.experience.dataset import (
        buffer_retriever,
        build_examples,
        select_transitions,
    )
    from components.experience.sft import save_model, train_sft
    from components.lm.generate import Generator
    from components.lm.models import count_parameters
    from components.schema import Trajectory, read_jsonl
    from components.stages.experience import load_base_model, prompt_settings
    from components.teacher.annotate import load_annotations

    cfg = load_config(PARAMS_FILE, profile="cpu")
    spec = dict(CANDIDATES[name])
    budget = spec.pop("budget_minutes", BUDGET_MINUTES)
    overrides = {**spec, "max_train_minutes": budget}
    ecfg = cfg.experience.model_copy(update=overrides)
    cfg = cfg.model_copy(update={"experience": ecfg})
    paths = Paths(Path(".").resolve())
    settings = prompt_settings(cfg)
    trajectories = list(read_jsonl(paths.trajectories_file, Trajectory))
    reasoning = load_annotations(paths.annotations_file)
    buf = ReplayBuffer.open(BUFFER, cfg.buffer, create=False)
    buf.checkout(SEED_TAG)
    retriever = buffer_retriever(buf, env=cfg.env.name)
    n_train = ecfg.max_steps * ecfg.batch_size * ecfg.grad_accum
    start = time.perf_counter()
    train, stats = build_examples(
        select_transitions(trajectories, "train", n_train, ecfg.seed),
        settings,
        reasoning,
        retriever,
    )
    # the same seeded sample of validation transitions for every candidate; a slow
    # candidate scores a prefix of it (compare on the shared prefix)
    n_eval = spec.get("eval_examples", EVAL_EXAMPLES)
    eval_ex, _ = build_examples(
        select_transitions(trajectories, "validation", EVAL_EXAMPLES, ecfg.seed)[:n_eval],
        settings,
        None,
        retriever,
        require_reasoning=False,
    )
    build_s = time.perf_counter() - start
    work = WORK / name
    shutil.rmtree(work, ignore_errors=True)
    model, tokenizer = load_base_model(ecfg, train, base_cache_dir(paths), work / "tokenizer")
    n_params = count_parameters(model)
    model, result = train_sft(
        model, tokenizer, train, ecfg, work / "ckpt", fingerprint={"bench": name}
    )
    save_model(model, tokenizer, work / "model", {"bench": name, "prompt": settings.as_dict()})
    gen = Generator(model, tokenizer)
    summary, rows = evaluate_fidelity(
        lambda prompts: gen.generate(
            prompts, max_new_tokens=ecfg.max_new_tokens, batch_size=ecfg.gen_batch_size
        ),
        eval_ex,
        with_reasoning=settings.with_reasoning,
    )
    minutes = result.seconds / 60
    return {
        "model": ecfg.model,
        "tiny_preset": ecfg.tiny_preset if ecfg.model == "tiny" else None,
        "n_parameters": n_params,
        "training": {
            **overrides,
            **result.metrics(),
            "examples_seen": result.steps * ecfg.batch_size * ecfg.grad_accum,
        },
        "data": {**stats, "build_seconds": round(build_s, 1), "prompt": settings.as_dict()},
        "fidelity": summary,
        "fidelity_per_train_minute": summary["fidelity_score"] / minutes if minutes else None,
        "sample_outputs": [r["output"][:600] for r in rows[:3]],
        "rows": [{k: r[k] for k in ROW_KEYS} for r in rows],
    }


def compare(candidates: dict[str, Any]) -> dict[str, Any]:
    """Score every candidate on the shared prefix of validation rows; pick by fidelity/min.

    Two costs per candidate: training minutes, and end-to-end minutes = training + the
    generation of EVAL_EXAMPLES answers at the measured rate (what the cpu pipeline pays
    for evaluate_fidelity; every synthetic step of the agent's RL is one more answer).
    The choice uses the end-to-end figure.
    """
    from components.evaluation.fidelity import summarize

    n = min(len(c["rows"]) for c in candidates.values())
    table = {}
    for name, c in candidates.items():
        s = summarize(c["rows"][:n])
        minutes = c["training"]["train_minutes"]
        answer_s = c["fidelity"]["generate_seconds"] / c["fidelity"]["n"]
        end_to_end = minutes + EVAL_EXAMPLES * answer_s / 60
        table[name] = {
            "model": c["model"],
            "n_parameters": c["n_parameters"],
            "train_minutes": minutes,
            "examples_seen": c["training"]["examples_seen"],
            "train_seconds_per_example": round(
                60 * minutes / max(c["training"]["examples_seen"], 1), 3
            ),
            "generate_seconds_per_answer": round(answer_s, 3),
            "end_to_end_minutes": round(end_to_end, 2),
            **{
                k: s[k]
                for k in (
                    "n",
                    "eps_R",
                    "eps_R_ci95_low",
                    "eps_R_ci95_high",
                    "eps_R_reward_1",
                    "state_exact_match",
                    "state_token_f1",
                    "malformed_rate",
                    "fidelity_score",
                    "copy_baseline_state_token_f1",
                )
            },
            "fidelity_per_train_minute": round(s["fidelity_score"] / minutes, 5),
            "fidelity_per_end_to_end_minute": round(s["fidelity_score"] / end_to_end, 5),
        }
    key = "fidelity_per_end_to_end_minute"
    ranked = sorted(table, key=lambda k: -table[k][key])
    why = "; ".join(
        f"{k}: fidelity {table[k]['fidelity_score']:.3f} (n={n}) after "
        f"{table[k]['train_minutes']:.1f} train min ({table[k]['examples_seen']} examples) = "
        f"{table[k]['fidelity_per_train_minute']:.4f}/train min; "
        f"{table[k]['generate_seconds_per_answer']} s per answer, "
        f"{table[k]['end_to_end_minutes']} min with {EVAL_EXAMPLES} answers = "
        f"{table[k][key]:.4f}/min"
        for k in ranked
    )
    return {"n_shared": n, "rule": key, "table": table, "choice": ranked[0], "why": why}


def main(names: list[str] | None = None) -> None:
    """Run the named candidates (default: all) and write the comparison JSON."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(int(os.environ.get("BENCH_TORCH_THREADS", "1")))  # see generate.py
    report = _load(RESULTS)
    report.setdefault("candidates", {})
    # rows from before the compact states / contract metrics cannot be re-scored
    stale = [k for k, c in report["candidates"].items() if "bucket_true" not in c["rows"][0]]
    for k in stale:
        report.setdefault("superseded", {})[k] = report["candidates"].pop(k)
    if names == ["compare"]:  # recompute the comparison from stored results only
        report["comparison"] = compare(report["candidates"])
        RESULTS.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        return
    for name in names or list(CANDIDATES):
        report["candidates"][name] = run_candidate(name)
        report["machine"] = {
            "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "platform": platform.platform(),
            "torch": metadata.version("torch"),
            "transformers": metadata.version("transformers"),
            "trl": metadata.version("trl"),
        }
        report["budget_minutes"] = BUDGET_MINUTES
        report["eval_examples"] = EVAL_EXAMPLES
        report["comparison"] = compare(report["candidates"])
        RESULTS.parent.mkdir(parents=True, exist_ok=True)
        RESULTS.write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")
        print(json.dumps({name: report["candidates"][name]["fidelity"]}, indent=2), flush=True)


if __name__ == "__main__":
    parser = bench_parser(
        "bench.experience_model",
        __doc__,
        env={
            "BENCH_EXPERIENCE_MINUTES": "training budget per candidate, minutes (default 12)",
            "BENCH_EXPERIENCE_EVAL": "validation transitions scored (default 200)",
            "BENCH_EXPERIENCE_BUFFER": "the replay buffer retrieved from (default data/buffer)",
            "BENCH_EXPERIENCE_WORK": "scratch folder (default /tmp/dreamgym-bench-experience)",
            "BENCH_TORCH_THREADS": "torch threads (default 1)",
        },
    )
    parser.add_argument(
        "candidates",
        nargs="*",
        metavar="CANDIDATE",
        help=f"candidates to train, in order (default: all of {', '.join(CANDIDATES)}); "
        "`compare` alone recomputes the comparison from the stored results",
    )
    main(parser.parse_args().candidates)
