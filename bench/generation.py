"""Generation throughput: reference vs HF batched generate vs the fast path, side by side.

``python -m bench.generation`` writes bench/results/generation.json. The model is the
cpu profile's trained experience model (models/experience[/full]) when present, else a
randomly initialised model of the same preset (recorded under ``model``). Prompts are
the experience model's real validation prompts (history, retrieved neighbours) when the
pipeline's data is there, else synthetic prompts of similar length. Every answer may run
to ``max_new_tokens`` (the cpu profile's value): the bounded cpu model rarely closes its
answer, so the stop string seldom shortens the work here.

``tokens_per_s`` = generated tokens (through stop/eos) / wall seconds of the whole call
(tokenisation, prefill and decoding), best of ``REPEATS`` runs on a shared machine.
Backends: ``reference`` (plain ``model.generate``, one prompt at a time), ``hf_generate``
(``model.generate`` on left-padded batches with transformers' stop-string criterion: the
implementation before this benchmark), ``fast`` (our decode loop), ``openai`` (the
OpenAI-compatible client against the local fake server: client + HTTP overhead only,
so it reports requests/s, not model tokens/s). ``roofline_fraction`` needs a GPU's decode
step time and peak bandwidth: null on CPU, the formula is in bench/roofline.py.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

from bench.common import bench_parser
from bench.roofline import decode_bytes_per_step, peak_bandwidth, roofline_fraction
from bench.sft_throughput import measure_sft

RESULTS = Path("bench/results")
MODEL_DIRS = tuple(
    Path(p)
    for p in (os.environ.get("BENCH_GEN_MODEL"), "models/experience/full", "models/experience")
    if p
)
BATCH_SIZES = (1, 8, 32)
MAX_NEW_TOKENS = int(os.environ.get("BENCH_GEN_MAX_NEW", "384"))  # the cpu profile's cap
REPEATS = int(os.environ.get("BENCH_GEN_REPEATS", "2"))
N_PROMPTS = 32
MIN_PROMPTS = 4  # batch 1 still averages over a few prompts
# -- model, prompts -------------------------------------------------------------------------


def load_model() -> tuple[Any, Any, dict[str, Any]]:
    """The trained cpu experience model if present, else a random one of its preset."""
    from components.lm.models import build_tiny_model, count_parameters, load_pretrained_dir

    for path in MODEL_DIRS:
        if (path / "config.json").exists():
            # a copy: a pipeline stage may replace the directory while we measure
            tmp = Path(tempfile.mkdtemp(prefix="bench-gen-")) / "model"
            shutil.copytree(path, tmp)
            model, tok = load_pretrained_dir(tmp)
            info = {"source": str(path), "trained": True}
            break
    else:
        from components.lm.tokenizer import train_tokenizer

        tok = train_tokenizer(_synthetic_corpus(), vocab_size=2048)
        model = build_tiny_model("micro", tok)
        info = {"source": "tiny micro preset, random init", "trained": False}
    info |= {"n_parameters": count_parameters(model), "dtype": str(model.dtype)}
    return model.eval(), tok, info


def _synthetic_corpus() -> list[str]:
    rooms = ("kitchen", "garden", "cellar", "attic", "library", "garage")
    things = ("key", "apple", "map", "lamp", "coin", "book", "knife")
    return [
        f"You are in the {r}. You see a {t}. The agent takes the {t} and goes to the {r2}."
        for r in rooms
        for t in things
        for r2 in rooms
    ]


def load_prompts(n: int) -> tuple[list[Any], str]:
    """Real validation prompts of the experience model, else synthetic ones (and which)."""
    try:
        return _real_prompts(n), "validation transitions (data/ingested, buffer seed)"
    except Exception as err:  # no pipeline data yet: the benchmark still runs
        corpus = _synthetic_corpus()
        text = " ".join(corpus)
        prompts = [
            [
                {"role": "system", "content": "Predict the next state."},
                {"role": "user", "content": text[i * 97 : i * 97 + 2400 + 60 * (i % 8)]},
            ]
            for i in range(n)
        ]
        return prompts, f"synthetic ({type(err).__name__}: no pipeline data)"


def _real_prompts(n: int) -> list[Any]:
    from components.config import PARAMS_FILE, Paths, load_config
    from components.experience.dataset import PromptSettings, build_examples, select_transitions
    from components.experience.sft import load_meta
    from components.stages.experience import load_trajectories, open_retriever

    model_dir = next(p for p in MODEL_DIRS if (p / "experience_model.json").exists())
    cfg = load_config(PARAMS_FILE, profile="cpu")
    paths = Paths(Path(".").resolve())
    settings = PromptSettings(**load_meta(model_dir)["prompt"])
    retriever = open_retriever(cfg, paths, settings.k)
    pairs = select_transitions(load_trajectories(paths), "validation", n, cfg.experience.seed)
    examples, _ = build_examples(pairs, settings, None, retriever, require_reasoning=False)
    return [list(ex.messages) for ex in examples][:n]


# -- measurements ---------------------------------------------------------------------------


def _timed(fn: Callable[[], list[int]], label: str = "") -> dict[str, Any]:
    """Best of REPEATS runs of ``fn`` (returns generated token counts)."""
    runs = []
    for _ in range(REPEATS):
        start = time.perf_counter()
        counts = fn()
        runs.append((time.perf_counter() - start, counts))
    seconds, counts = min(runs, key=lambda r: r[0])
    if label:
        print(f"  {label}: {sum(counts) / seconds:.1f} tokens/s ({seconds:.1f} s)", flush=True)
    return {
        "tokens_per_s": round(sum(counts) / seconds, 1),
        "seconds": round(seconds, 3),
        "seconds_all": [round(r[0], 3) for r in runs],
        "prompts": len(counts),
        "new_tokens": sum(counts),
    }


def hf_generate_counts(
    model: Any, tok: Any, prompts: Sequence[Any], batch_size: int, max_new: int
) -> list[int]:
    """``model.generate`` on sorted, left-padded batches with the stop-string criterion."""
    import torch

    from components.lm.generate import DEFAULT_STOP, Decoding, Generator, render_prompts

    gen = Generator(model, tok)  # only for its padding helper, eos ids and generate args
    encoded = [tok(t, add_special_tokens=False)["input_ids"] for t in render_prompts(tok, prompts)]
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    eos, pad = gen._eos_ids(), gen._pad_id()
    # the reference path's greedy model.generate arguments, stop strings included
    greedy = gen._kwargs(Decoding(max_new, 0.0, 1.0, tuple(DEFAULT_STOP), batch_size, None, False))
    counts = []
    with torch.inference_mode():
        for start in range(0, len(order), batch_size):
            batch = [encoded[i] for i in order[start : start + batch_size]]
            ids, mask = gen._left_pad(batch, max(len(e) for e in batch))
            out = model.generate(input_ids=ids, attention_mask=mask, **greedy)
            for seq in out[:, ids.shape[1] :].tolist():
                n = next((i + 1 for i, t in enumerate(seq) if t in eos), len(seq))
                # a row stopped by the stop string is padded afterwards
                while n > 0 and seq[n - 1] == pad and pad not in eos:
                    n -= 1
                counts.append(n)
    return counts


def measure_local(
    model: Any, tok: Any, prompts: list[Any], max_new: int, threads: int | None
) -> dict[str, Any]:
    """tokens/s of reference, hf_generate and fast at each batch size."""
    from components.lm.generate import DEFAULT_STOP, Generator, torch_threads

    out: dict[str, Any] = {"reference": {}, "hf_generate": {}, "fast": {}}
    finish: Counter[str] = Counter()

    def run(gen: Generator, batch: list[Any], bs: int, mnt: int = max_new) -> list[int]:
        done = gen.complete(batch, max_new_tokens=mnt, stop=DEFAULT_STOP, batch_size=bs)
        finish.update(c.finish_reason for c in done)
        return [c.n_tokens for c in done]

    ref = Generator(model, tok, fast=False, threads=threads)
    fast = Generator(model, tok, threads=threads)
    small = prompts[:MIN_PROMPTS]
    run(fast, small[:2], 2, 4)  # warm-up: first-call allocations, lazy imports
    out["reference"]["1"] = _timed(lambda: run(ref, small, 1), "reference 1")
    for bs in BATCH_SIZES:
        batch = prompts[: max(bs, MIN_PROMPTS)]
        with torch_threads(threads):
            out["hf_generate"][str(bs)] = _timed(
                lambda b=batch, s=bs: hf_generate_counts(model, tok, b, s, max_new),
                f"hf_generate {bs}",
            )
        out["fast"][str(bs)] = _timed(lambda b=batch, s=bs: run(fast, b, s), f"fast {bs}")
        # the decode-only rate: the same batch's prefill (1 new token) subtracted
        prefill = _timed(lambda b=batch, s=bs: run(fast, b, s, 1))["seconds"]
        entry = out["fast"][str(bs)]
        steps = max_new - 1
        decode_s = max(entry["seconds"] - prefill, 1e-9)
        entry["prefill_seconds"] = prefill
        entry["prefill_share"] = round(prefill / entry["seconds"], 3)
        entry["decode_step_ms"] = round(1000 * decode_s / steps / -(-len(batch) // bs), 2)
    # the configuration before this benchmark: batched model.generate, torch's default threads
    batch = prompts[:8]
    out["hf_generate_default_threads"] = {
        "8": _timed(
            lambda: hf_generate_counts(model, tok, batch, 8, max_new), "hf_generate 8 default"
        )
    }
    out["finish_reasons"] = dict(finish)
    return out


def greedy_agreement(model: Any, tok: Any, prompts: list[Any], max_new: int) -> dict[str, Any]:
    """Do fast (one batch) and reference produce the same greedy answers on real prompts?"""
    from components.lm.generate import Generator

    sample = prompts[:8]
    ref = Generator(model, tok, fast=False).generate(sample, max_new_tokens=max_new)
    fast = Generator(model, tok).generate(sample, max_new_tokens=max_new, batch_size=8)
    return {
        "prompts": len(sample),
        "identical": sum(a == b for a, b in zip(ref, fast, strict=True)),
    }


def measure_threads_and_dtype(
    model: Any, tok: Any, prompts: list[Any], max_new: int
) -> dict[str, Any]:
    """fast at batch 8: 1 vs 2 threads (fp32), fp32 vs bf16 (1 thread) at 1/8/32."""
    import copy

    import torch

    from components.lm.generate import Generator

    def fast_run(m: Any, threads: int, bs: int) -> dict[str, Any]:
        gen = Generator(m, tok, threads=threads)
        batch = prompts[: max(bs, MIN_PROMPTS)]
        return _timed(
            lambda: [c.n_tokens for c in gen.complete(batch, max_new_tokens=max_new, batch_size=bs)]
        )

    bf16 = copy.deepcopy(model).to(torch.bfloat16)
    return {
        "threads": {str(t): fast_run(model, t, 8)["tokens_per_s"] for t in (1, 2)},
        "dtype": {
            name: {str(bs): fast_run(m, 1, bs)["tokens_per_s"] for bs in BATCH_SIZES}
            for name, m in (("float32", model), ("bfloat16", bf16))
        },
    }


def profile_fast(model: Any, tok: Any, prompts: list[Any], max_new: int) -> dict[str, Any]:
    """Where fast CPU decoding spends its time (torch profiler, batch 8)."""
    from torch.profiler import ProfilerActivity, profile

    from components.lm.generate import Generator

    gen = Generator(model, tok)
    batch = prompts[:8]
    gen.complete(batch[:2], max_new_tokens=4, batch_size=2)
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        start = time.perf_counter()
        gen.complete(batch, max_new_tokens=min(max_new, 64), batch_size=8)
        wall = time.perf_counter() - start
    events = sorted(prof.key_averages(), key=lambda e: -e.self_cpu_time_total)
    total = sum(e.self_cpu_time_total for e in events) or 1
    top = [
        {
            "op": e.key,
            "share": round(e.self_cpu_time_total / total, 3),
            "calls": e.count,
            "ms": round(e.self_cpu_time_total / 1000, 1),
        }
        for e in events[:8]
    ]
    op_ms = total / 1000
    return {
        "batch": 8,
        "new_tokens": min(max_new, 64),
        "wall_s": round(wall, 3),
        "torch_ops_ms": round(op_ms, 1),
        "python_and_other_share": round(max(0.0, 1 - op_ms / 1000 / wall), 3),
        "top_ops": top,
    }


def measure_openai_client(n: int = 256) -> dict[str, Any]:
    """Requests/s of the OpenAI backend against the local fake (client + HTTP only)."""
    import random

    from components.lm.openai_backend import OpenAIBackend, OpenAIBackendConfig
    from tests.fakes.openai_server import FakeOpenAIServer

    answer = "<think>t</think><state>s</state><reward>0</reward>"
    with FakeOpenAIServer(answer_fn=lambda body: answer, honor_stop=True) as srv:
        os.environ["DREAMGYM_BENCH_OPENAI_URL"] = srv.base_url
        cfg = OpenAIBackendConfig(
            model="fake", base_url_env="DREAMGYM_BENCH_OPENAI_URL", api_key_env="DREAMGYM_NONE"
        )
        out: dict[str, Any] = {}
        for conc in (1, 8, 32):
            backend = OpenAIBackend(
                cfg.model_copy(update={"concurrency": conc}), rng=random.Random(0)
            )
            prompts = [[{"role": "user", "content": f"p{i}"}] for i in range(n)]
            start = time.perf_counter()
            texts = backend.generate(prompts)
            seconds = time.perf_counter() - start
            backend.close()
            assert all(t == answer for t in texts)
            out[str(conc)] = {"requests_per_s": round(n / seconds, 1), "requests": n}
    return out


def _device() -> dict[str, Any]:
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name(0)
        return {"type": "cuda", "name": name, "peak_bandwidth_bytes_per_s": peak_bandwidth(name)}
    return {
        "type": "cpu",
        "name": platform.processor() or platform.machine(),
        "cores": os.cpu_count(),
        "torch_threads_default": torch.get_num_threads(),
        "peak_bandwidth_bytes_per_s": None,
    }


def main() -> dict[str, Any]:
    """Run the generation benchmarks; writes bench/results/generation.json."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    from components.lm.generate import render_prompts

    load_before = [round(x, 2) for x in os.getloadavg()]
    model, tok, model_info = load_model()
    prompts, prompt_source = load_prompts(N_PROMPTS)
    prompt_tokens = [
        len(tok(t, add_special_tokens=False)["input_ids"]) for t in render_prompts(tok, prompts)
    ]
    result: dict[str, Any] = {
        "device": _device(),
        "model": model_info,
        "prompts": {
            "source": prompt_source,
            "n": len(prompts),
            "mean_tokens": round(statistics.mean(prompt_tokens), 1),
            "max_tokens": max(prompt_tokens),
        },
        "max_new_tokens": MAX_NEW_TOKENS,
        "repeats": REPEATS,
        "load_avg_before": load_before,
    }
    # every backend on the same thread count (the tuned one): the ratios isolate the code
    local = measure_local(model, tok, prompts, MAX_NEW_TOKENS, threads=1)
    result["tokens_per_s"] = {
        name: {bs: m["tokens_per_s"] for bs, m in local[name].items()}
        for name in ("reference", "hf_generate", "fast")
    }
    result["runs"] = local
    result["speedup_fast_vs_hf_generate"] = {
        bs: round(local["fast"][bs]["tokens_per_s"] / local["hf_generate"][bs]["tokens_per_s"], 2)
        for bs in local["fast"]
    }
    result["speedup_fast_vs_hf_generate_default_threads"] = round(
        local["fast"]["8"]["tokens_per_s"]
        / local["hf_generate_default_threads"]["8"]["tokens_per_s"],
        2,
    )
    result["speedup_fast_vs_reference"] = round(
        max(m["tokens_per_s"] for m in local["fast"].values())
        / local["reference"]["1"]["tokens_per_s"],
        2,
    )
    result["greedy_agreement"] = greedy_agreement(model, tok, prompts, 64)
    result["cpu_tuning"] = measure_threads_and_dtype(model, tok, prompts, MAX_NEW_TOKENS)
    result["profile"] = profile_fast(model, tok, prompts, MAX_NEW_TOKENS)
    # bytes a decode step reads at the mean context (prompt + half the answer), and the
    # bandwidth that achieves; a share of the peak only where the peak is known (GPUs)
    context = result["prompts"]["mean_tokens"] + MAX_NEW_TOKENS / 2
    step_bytes = {bs: decode_bytes_per_step(model, int(bs), context) for bs in local["fast"]}
    result["decode_bytes_per_step"] = {bs: int(b) for bs, b in step_bytes.items()}
    result["decode_bandwidth_gb_per_s"] = {
        bs: round(step_bytes[bs] / (m["decode_step_ms"] / 1000) / 1e9, 2)
        for bs, m in local["fast"].items()
    }
    peak = result["device"]["peak_bandwidth_bytes_per_s"]
    result["roofline_fraction"] = (
        {
            bs: round(roofline_fraction(step_bytes[bs], m["decode_step_ms"] / 1000, peak), 4)
            for bs, m in local["fast"].items()
        }
        if peak
        else None
    )
    try:
        result["openai_client"] = measure_openai_client()
    except Exception as err:  # e.g. tests/ not shipped: skip, say why
        result["openai_client"] = {"skipped": repr(err)}
    try:
        result["sft_training"] = measure_sft()
    except Exception as err:
        result["sft_training"] = {"skipped": repr(err)}
    result["retrieval_latency"] = "see bench/results/buffer.json (p50/p99 ms per retrieve)"
    result["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
    result["versions"] = {k: metadata.version(k) for k in ("torch", "transformers")}
    result["profile_notes"] = profile_notes(result)
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "generation.json").write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps({k: result[k] for k in ("tokens_per_s", "profile_notes")}, indent=2))
    return result


def profile_notes(r: dict[str, Any]) -> str:
    """A short text of what dominates CPU generation time, from the measured numbers."""
    fast = r["runs"]["fast"]
    top = ", ".join(f"{o['op']} {o['share']:.0%}" for o in r["profile"]["top_ops"][:4])
    shares = ", ".join(f"batch {bs}: {m['prefill_share']:.0%}" for bs, m in fast.items())
    steps = ", ".join(f"batch {bs}: {m['decode_step_ms']} ms" for bs, m in fast.items())
    tuning = r["cpu_tuning"]
    weights_mb = r["model"]["n_parameters"] * 4 / 1e6
    step_mb = {bs: round(b / 1e6, 1) for bs, b in r["decode_bytes_per_step"].items()}
    return (
        f"Machine: {r['device']['cores']} cores shared with other jobs (load "
        f"{r['load_avg_before']} -> {r['load_avg_after']}). Prefill share of the wall time "
        f"({shares}): prompts average {r['prompts']['mean_tokens']} tokens, and prefill "
        f"attention grows with their square. Decode step ({steps}); bytes read per step "
        f"(weights {weights_mb:.1f} MB + KV cache) {step_mb} MB, i.e. "
        f"{r['decode_bandwidth_gb_per_s']} GB/s: the KV cache, not the weights, is what a "
        "decode step reads, so batching adds rows of KV and helps little. Top torch ops "
        f"(batch 8, 64 tokens): {top}; the rest of the wall time is Python "
        f"({r['profile']['python_and_other_share']:.0%}). Fixed in the fast path (profiled "
        "before/after at batch 8): transformers' DynamicCache grew by torch.cat every step "
        "(a full KV copy: 31% of the time, now preallocated buffers, 4.6 -> 2.7 s); the "
        "padding mask was rebuilt from 2D every step (now one boolean view, none when no row "
        "is padded); rows stop at </reward> and leave the batch. Threads (fast, batch 8, "
        f"tokens/s): {tuning['threads']}: with the cores contended, 2 OpenMP threads wait "
        "on each other (a decode step 2.7 -> 19 ms, a prefill 0.04 -> 2 s in a probe), so "
        f"small models run on 1 thread. dtype (fast, tokens/s by batch): {tuning['dtype']}."
    )


if __name__ == "__main__":
    bench_parser(
        "bench.generation",
        __doc__,
        env={
            "BENCH_GEN_MODEL": "model folder tried first (then models/experience/full, "
            "models/experience)",
            "BENCH_GEN_MAX_NEW": "max new tokens per answer (default 384)",
            "BENCH_GEN_REPEATS": "runs per measurement, the best reported (default 2)",
            "BENCH_GEN_SFT_STEPS": "SFT steps timed for the training rate (default 6)",
        },
    ).parse_args()
    main()
