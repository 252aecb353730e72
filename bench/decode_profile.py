"""Where a GPU decode step's time goes: GPU time per kernel vs the graph-replayed step.

``python -m bench.decode_profile`` writes bench/results/gpu_decode_profile.json
(``BENCH_GPU_OUT`` to write elsewhere); without CUDA it prints why and writes nothing.

For each decoder of ``bench.gpu_decode.GRAPH_BACKENDS`` named in ``BENCH_PROFILE_BACKENDS``
and each prompt length of ``BENCH_PROFILE_PROMPTS`` (batch ``BENCH_GPU_BATCH``, SmolLM2-135M
bf16 as in ``bench.gpu_decode``):

- ``graph_step_ms``: one step replayed as a CUDA graph (mean of ``STEPS`` replays, CUDA
  events);
- ``kernels``: the same step run eagerly under ``torch.profiler`` (CUPTI): per kernel
  category, the GPU microseconds per step and the kernel count, plus the ten costliest
  kernels. ``kernel_ms`` is their sum; ``graph_step_ms - kernel_ms`` is what the graph
  spends between kernels (launch latency, tails).

The attended columns are the prompt's: the step re-writes one column (the cost of a step
at that context).
"""

from __future__ import annotations

import json
import os
from collections import defaultdict
from pathlib import Path
from typing import Any

from bench.common import bench_parser

RESULTS = Path(os.environ.get("BENCH_GPU_OUT", "bench/results")) / "gpu_decode_profile.json"
BACKENDS = os.environ.get(
    "BENCH_PROFILE_BACKENDS", "graph_triton_compiled,graph_fused,graph_fused_pdl"
).split(",")
PROMPTS = tuple(int(x) for x in os.environ.get("BENCH_PROFILE_PROMPTS", "512,2048").split(","))
STEPS = 20
# kernel name fragments -> category (first match wins)
CATEGORIES = (
    ("decode_attention", "attention"),
    ("fused_linear", "fused_gemm"),
    ("gemm", "cublas_gemm"),
    ("nvjet", "cublas_gemm"),
    ("cutlass", "cublas_gemm"),
    ("xmma", "cublas_gemm"),
    ("triton", "compiled_elementwise"),
    ("reduce", "torch_reduce"),
    ("elementwise", "torch_elementwise"),
    ("index", "torch_index"),
)


def category(name: str) -> str:
    """The category of a CUDA kernel, from its name."""
    low = name.lower()
    return next((cat for frag, cat in CATEGORIES if frag in low), "other")


def graph_step_ms(dec: Any, steps: int) -> float:
    """Mean ms of one replayed step graph (captured on first use)."""
    import torch

    dec._run_step(dec.capacity)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(steps):
        dec._run_step(dec.capacity)
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / steps


def kernel_profile(dec: Any, steps: int) -> dict[str, Any]:
    """GPU time per kernel category of one eager step (torch.profiler, CUDA activity)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    graphs, dec.graphs = dec.graphs, False
    try:
        dec._run_step(dec.capacity)  # eager warm-up (compiled code, autotuned kernels)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                dec._run_step(dec.capacity)
            torch.cuda.synchronize()
    finally:
        dec.graphs = graphs
    by_cat: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    by_name: dict[str, float] = defaultdict(float)
    for ev in prof.events():
        if ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        us = ev.time_range.elapsed_us()
        by_cat[category(ev.name)][0] += us
        by_cat[category(ev.name)][1] += 1
        by_name[ev.name[:120]] += us
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:10]
    return {
        "kernel_ms": round(sum(v[0] for v in by_cat.values()) / steps / 1000, 4),
        "kernels_per_step": round(sum(v[1] for v in by_cat.values()) / steps, 1),
        "by_category_us": {
            c: {"us": round(v[0] / steps, 1), "count": round(v[1] / steps, 1)}
            for c, v in sorted(by_cat.items(), key=lambda kv: -kv[1][0])
        },
        "top_kernels_us": {n: round(us / steps, 1) for n, us in top},
    }


def main() -> dict[str, Any] | None:
    """Profile each backend at each prompt length; writes gpu_decode_profile.json."""
    import torch

    from bench.gpu_decode import BATCH, GRAPH_BACKENDS, build_model, make_decoder, run_graph

    if not torch.cuda.is_available():
        print(f"no CUDA device: {RESULTS} left as it is (run this on a GPU machine)")
        return None
    model, info = build_model("cuda", torch.bfloat16)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "model": info,
        "batch": BATCH,
        "steps": STEPS,
        "by_prompt_len": {},
        "errors": {},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    for width in PROMPTS:
        ids = torch.randint(0, model.config.vocab_size, (BATCH, width), device="cuda")
        row = result["by_prompt_len"].setdefault(str(width), {})
        for label in BACKENDS:
            try:
                dec = make_decoder(model, BATCH, width + 8, **GRAPH_BACKENDS[label])
                run_graph(dec, ids, 4)  # prefill, autotune, compile
                entry = {"graph_step_ms": round(graph_step_ms(dec, STEPS), 4)}
                entry |= kernel_profile(dec, STEPS)
                entry["between_kernels_ms"] = round(entry["graph_step_ms"] - entry["kernel_ms"], 4)
                row[label] = entry
                print(f"P={width} {label} {json.dumps(entry)[:400]}", flush=True)
                del dec
            except Exception as err:  # one backend failing must not lose the others
                result["errors"][f"{label}@{width}"] = repr(err)[:500]
                print(f"P={width} {label} failed: {err!r}"[:500], flush=True)
            tmp = RESULTS.with_suffix(".tmp")
            tmp.write_text(json.dumps(result, indent=2) + "\n")
            tmp.replace(RESULTS)
    return result


if __name__ == "__main__":
    bench_parser(
        "bench.decode_profile",
        __doc__,
        env={
            "BENCH_GPU_OUT": "folder of gpu_decode_profile.json (default bench/results)",
            "BENCH_PROFILE_BACKENDS": "graph backends of bench.gpu_decode to profile, "
            "comma-separated (default graph_triton_compiled,graph_fused,graph_fused_pdl)",
            "BENCH_PROFILE_PROMPTS": "prompt lengths, comma-separated (default 512,2048)",
            "BENCH_GPU_BATCH": "rows decoded together (default 256)",
        },
    ).parse_args()
    main()
