"""GPU decode throughput at batch 256: transformers ``generate`` vs our graph decode path.

``python -m bench.gpu_decode`` writes bench/results/gpu_decode.json (``BENCH_GPU_OUT`` to
write elsewhere). Without CUDA it prints why and leaves the committed results alone.

Model: SmolLM2-135M in bfloat16 (30 layers, 9 query / 3 key-value heads of 64). The
converted packaged weights are used when present (``models/base/smollm2-135m-instruct``,
made by the gpu profile); otherwise the same architecture with random weights: the device
machines here are reached through a 64 MiB transfer and have no network, and a decode
step's cost does not depend on the weight values because every row decodes exactly
``NEW_TOKENS`` tokens (eos ignored, no stop strings).

Prompts: random token ids, every row the same length (no padding), for each prompt
length in ``PROMPT_LENS``; ``BATCH`` rows decoded together. Backends, measured one after
the other in one process on the same prompts:

- ``hf_generate``: plain ``model.generate`` (greedy, dynamic cache, SDPA attention), all
  rows in one call: the baseline.
- ``graph_torch``: ``components.lm.graph_decode.GraphDecoder`` with its attention as eager
  torch ops (~8 kernels a layer), the step captured once per attended length as a CUDA
  graph.
- ``graph_torch_compiled``: the same step through ``torch.compile`` before capture.
- ``graph_triton``: the attention as one Triton kernel per layer
  (``components.lm.decode_attention``: rotary, cache write, masked GQA attention), one
  CUDA graph for every step.
- ``graph_triton_compiled``: that, with the rest of the layer through ``torch.compile``.
- ``graph_triton_compiled_2mb``: that, the rows split in two micro-batches decoded on two
  CUDA streams in the one graph (one half's attention overlaps the other's matmuls).
- ``graph_fused``: the experimental ``bench.fused_decode.FusedGraphDecoder``: five Triton
  kernels a layer (RMSNorm folded into the q/k/v and gate/up GEMMs, SiLU and residual adds
  in GEMM epilogues), no torch.compile. ``graph_fused_pdl``: its GEMMs launched as
  programmatic dependent launches (resident before the previous kernel ends);
  ``graph_fused_f32``: that, with a float32 residual stream that the o / down GEMMs add
  into in place (split-K).

``BENCH_GPU_BACKENDS`` (comma-separated labels) measures a subset, e.g. a candidate beside
the default; ``hf_generate`` stays the baseline whenever it is listed.

Per backend: prefill and decode seconds (CUDA-synchronised wall clock, after one warm-up
call that also captures the graphs), decode step ms, tokens/s over the whole call and
over decoding alone, and the memory-bandwidth roofline fraction of a decode step:
``(weights + KV cache read at the mean context, prompt + NEW_TOKENS / 2) / step time /
the GPU's peak bandwidth`` (``bench.roofline.decode_bytes_per_step``). Greedy agreement
of the graph path with ``generate`` is checked in float32 on a few rows.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

from bench.common import bench_parser
from bench.roofline import decode_bytes_per_step, peak_bandwidth, roofline_fraction

RESULTS = Path(os.environ.get("BENCH_GPU_OUT", "bench/results")) / "gpu_decode.json"
BATCH = int(os.environ.get("BENCH_GPU_BATCH", "256"))
NEW_TOKENS = int(os.environ.get("BENCH_GPU_NEW", "256"))
PROMPT_LENS = tuple(
    int(x) for x in os.environ.get("BENCH_GPU_PROMPTS", "512,1024,2048,3072,4096").split(",")
)
BACKENDS = tuple(
    x for x in os.environ.get("BENCH_GPU_BACKENDS", "").split(",") if x
)  # empty: all of them
SMOLLM2_DIR = Path("models/base/smollm2-135m-instruct")
# label -> GraphDecoder options; the compiled ones last (a slow compile costs nothing else)
GRAPH_BACKENDS: dict[str, dict[str, Any]] = {
    "graph_torch": {"attention": "torch"},
    "graph_triton": {"attention": "triton"},
    "graph_fused": {"decoder": "fused"},
    "graph_fused_pdl": {"decoder": "fused", "pdl": True},
    "graph_fused_f32": {"decoder": "fused", "pdl": True, "f32_residual": True},
    "graph_triton_compiled": {"attention": "triton", "compile": True},
    "graph_triton_compiled_2mb": {"attention": "triton", "compile": True, "micro_batches": 2},
    "graph_torch_compiled": {"attention": "torch", "compile": True},
}
# SmolLM2-135M(-Instruct)'s config.json, the fields that shape the computation
SMOLLM2_135M = {
    "vocab_size": 49152,
    "hidden_size": 576,
    "intermediate_size": 1536,
    "num_hidden_layers": 30,
    "num_attention_heads": 9,
    "num_key_value_heads": 3,
    "max_position_embeddings": 8192,
    "rms_norm_eps": 1e-5,
    "rope_theta": 100000.0,
    "tie_word_embeddings": True,
    "hidden_act": "silu",
}


def make_decoder(model: Any, batch: int, capacity: int, **options: Any) -> Any:
    """A graph decoder from a ``GRAPH_BACKENDS`` entry (``decoder="fused"``: the candidate)."""
    from components.lm.graph_decode import GraphDecoder

    if options.pop("decoder", None) == "fused":
        from bench.fused_decode import FusedGraphDecoder

        return FusedGraphDecoder(model, batch, capacity, **options)
    return GraphDecoder(model, batch, capacity, **options)


def build_model(device: str, dtype: Any) -> tuple[Any, dict[str, Any]]:
    """SmolLM2-135M: the converted packaged weights if present, else random weights."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM

    if (SMOLLM2_DIR / "config.json").exists():
        model = AutoModelForCausalLM.from_pretrained(SMOLLM2_DIR, dtype=dtype)
        info = {"weights": f"packaged SmolLM2-135M-Instruct ({SMOLLM2_DIR})"}
    else:
        torch.manual_seed(0)
        cfg = LlamaConfig(**SMOLLM2_135M, attn_implementation="sdpa")
        model = LlamaForCausalLM(cfg).to(dtype)
        info = {"weights": "random init from the SmolLM2-135M config (cost is the same)"}
    model = model.to(device).eval()
    info |= {
        "architecture": "SmolLM2-135M",
        "n_parameters": sum(p.numel() for p in model.parameters()),
        "dtype": str(dtype).removeprefix("torch."),
        "attn_implementation": model.config._attn_implementation,
    }
    return model, info


def _sync() -> None:
    import torch

    torch.cuda.synchronize()


def run_hf(model: Any, ids: Any, new: int) -> tuple[float, float, Any]:
    """(prefill s, decode s, new tokens) of ``model.generate`` on the whole batch."""
    kw = {"do_sample": False, "pad_token_id": 0, "eos_token_id": None}
    mask = ids.new_ones(ids.shape)
    _sync()
    start = time.perf_counter()
    model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=1, min_new_tokens=1, **kw)
    _sync()
    prefill = time.perf_counter() - start
    start = time.perf_counter()
    out = model.generate(
        input_ids=ids, attention_mask=mask, max_new_tokens=new, min_new_tokens=new, **kw
    )
    _sync()
    total = time.perf_counter() - start
    return prefill, max(total - prefill, 1e-9), out[:, ids.shape[1] :]


def run_graph(dec: Any, ids: Any, new: int) -> tuple[float, float, Any]:
    """(prefill s, decode s, new tokens) of the graph decoder (greedy)."""
    import torch

    def greedy(logits: Any) -> tuple[Any, None]:
        return torch.argmax(logits, dim=-1), None

    with torch.inference_mode():
        tokens, _ = dec.generate(ids, ids.new_ones(ids.shape), max_new_tokens=new, pick=greedy)
    t = dec.last_timings
    return t.prefill_s, t.decode_s, tokens


def entry(
    model: Any, prefill: float, decode: float, n_rows: int, width: int, new: int, peak: float
) -> dict[str, Any]:
    """Throughput and roofline figures of one measured call."""
    step_s = decode / (new - 1)  # the first token comes from the prefill
    step_bytes = decode_bytes_per_step(model, n_rows, width + new / 2)
    return {
        "prefill_s": round(prefill, 4),
        "decode_s": round(decode, 4),
        "decode_step_ms": round(step_s * 1000, 4),
        "tokens_per_s": round(n_rows * new / (prefill + decode), 1),
        "decode_tokens_per_s": round(n_rows * (new - 1) / decode, 1),
        "decode_bytes_per_step": int(step_bytes),
        "achieved_gb_per_s": round(step_bytes / step_s / 1e9, 1),
        "roofline_fraction": round(roofline_fraction(step_bytes, step_s, peak), 4),
    }


def agreement(model: Any, n_rows: int = 8, width: int = 256, new: int = 32) -> dict[str, Any]:
    """float32: do the graph path and ``generate`` pick the same greedy tokens?"""
    import copy

    import torch

    m32 = copy.deepcopy(model).float()
    ids = torch.randint(0, m32.config.vocab_size, (n_rows, width), device="cuda")
    _, _, ref = run_hf(m32, ids, new)
    result: dict[str, Any] = {"rows": n_rows, "new_tokens": new}
    variants = {
        "torch": {"attention": "torch"},
        "triton": {"attention": "triton"},
        "triton_2mb": {"attention": "triton", "micro_batches": 2},
        "fused": {"decoder": "fused"},
        "fused_f32": {"decoder": "fused", "pdl": True, "f32_residual": True},
    }
    if BACKENDS:  # a subset run checks the variants it measures
        measured = [GRAPH_BACKENDS[x] for x in BACKENDS if x in GRAPH_BACKENDS]
        variants = {
            k: v
            for k, v in variants.items()
            if any(all(m.get(o) == val for o, val in v.items()) for m in measured)
        }
    for label, options in variants.items():
        dec = make_decoder(m32, n_rows, width + new, bucket=64, **options)
        _, _, ours = run_graph(dec, ids, new)
        result[f"identical_rows_{label}"] = int((ref == ours).all(dim=1).sum())
    return result


def main() -> dict[str, Any] | None:
    """Run the GPU decode benchmark; writes gpu_decode.json (CUDA only)."""
    import torch

    if not torch.cuda.is_available():
        print(f"no CUDA device: {RESULTS} left as it is (run this on a GPU machine)")
        return None
    name = torch.cuda.get_device_name(0)
    peak = peak_bandwidth(name)
    if peak is None:
        raise SystemExit(f"unknown peak bandwidth for {name!r}: add it to PEAK_BANDWIDTH")
    model, info = build_model("cuda", torch.bfloat16)
    result: dict[str, Any] = {
        "device": {
            "name": name,
            "peak_bandwidth_bytes_per_s": peak,
            "torch": torch.__version__,
            "cuda": torch.version.cuda,
        },
        "model": info,
        "batch": BATCH,
        "new_tokens": NEW_TOKENS,
        "prompt_lens": list(PROMPT_LENS),
        "by_prompt_len": {},
        "errors": {},
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        tmp = RESULTS.with_suffix(".tmp")
        tmp.write_text(json.dumps(result, indent=2) + "\n")
        tmp.replace(RESULTS)

    try:
        result["greedy_agreement_fp32"] = agreement(model)
    except Exception as err:  # report, keep measuring
        result["errors"]["agreement"] = repr(err)
    save()
    width_max = max(PROMPT_LENS)
    prompts = {}
    for width in PROMPT_LENS:
        gen = torch.Generator(device="cuda").manual_seed(width)
        vocab = model.config.vocab_size
        prompts[width] = torch.randint(0, vocab, (BATCH, width), device="cuda", generator=gen)
    decoders: dict[str, Any] = {}
    labels = [x for x in ("hf_generate", *GRAPH_BACKENDS) if not BACKENDS or x in BACKENDS]
    for label in labels:
        for width in PROMPT_LENS:
            ids = prompts[width]
            row = result["by_prompt_len"].setdefault(str(width), {})
            try:
                if label == "hf_generate":
                    with torch.inference_mode():
                        run_hf(model, ids[:, :64], 4)  # warm-up
                        pre, dec, _ = run_hf(model, ids, NEW_TOKENS)
                else:
                    if label not in decoders:
                        decoders.clear()  # one decoder's cache at a time
                        decoders[label] = make_decoder(
                            model, BATCH, width_max + NEW_TOKENS, **GRAPH_BACKENDS[label]
                        )
                    started = time.perf_counter()
                    run_graph(decoders[label], ids, NEW_TOKENS)  # warm-up: captures graphs
                    row.setdefault("warmup_s", {})[label] = round(time.perf_counter() - started, 1)
                    pre, dec, _ = run_graph(decoders[label], ids, NEW_TOKENS)
                row[label] = entry(model, pre, dec, BATCH, width, NEW_TOKENS, peak)
                if label != "hf_generate" and "hf_generate" in row:
                    row[label]["speedup_vs_hf_generate"] = round(
                        row[label]["tokens_per_s"] / row["hf_generate"]["tokens_per_s"], 2
                    )
                print(f"P={width} {label} {row[label]}", flush=True)
            except Exception as err:  # one backend failing must not lose the others
                result["errors"][f"{label}@{width}"] = repr(err)[:500]
                print(f"P={width} {label} failed: {err!r}"[:500], flush=True)
            save()
    result["memory_peak_gb"] = round(torch.cuda.max_memory_allocated() / 1e9, 2)
    from bench.fused_decode import autotuned

    result["fused_tiles"] = autotuned()
    save()
    print(json.dumps(result, indent=2))
    return result


if __name__ == "__main__":
    bench_parser(
        "bench.gpu_decode",
        __doc__,
        env={
            "BENCH_GPU_OUT": "folder of gpu_decode.json (default bench/results)",
            "BENCH_GPU_BATCH": "rows decoded together (default 256)",
            "BENCH_GPU_NEW": "tokens decoded per row (default 256)",
            "BENCH_GPU_PROMPTS": "prompt lengths, comma-separated "
            "(default 512,1024,2048,3072,4096)",
            "BENCH_GPU_BACKENDS": "the backends to measure, comma-separated (default: all of "
            f"hf_generate, {', '.join(GRAPH_BACKENDS)})",
        },
    ).parse_args()
    main()
