"""What each CPU kernel mode (``DREAMGYM_CPU_KERNELS``, components/cpu_kernels.py) costs
on the work the cpu profile does with MKL, side by side in one run.

``python -m bench.cpu_kernels`` (also part of ``make bench``) writes
bench/results/cpu_kernels.json. For each mode (``avx2``, the default; ``portable``, MKL on
its COMPATIBLE branch, the one it runs alike on Intel and AMD; ``native``) a fresh process
(the libraries read their variables when they load) times:

- ``embed_s``: the policy's frozen embedder (params.yaml ``agent.scorer.embedder``)
  embedding fixed game-like texts (the featurizer's cache misses);
- ``head_s``: Adam steps of the scoring head itself (``build_net`` at the featurizer's
  sizes) on fixed batches of 64 decisions x 16 candidates (SFT, DPO and the RL updates);

and records ``kernels`` (what the run's provenance would say, with the branch MKL really
took) and SHA-256 prefixes of the embeddings and of the trained weights, so the JSON also
shows which modes give the same bits on this host. The modes alternate over
``BENCH_KERNEL_REPEATS`` rounds (default 3) and each time is the median, so load on the
machine falls on all of them alike. ``*_vs_avx2`` are time ratios to the default.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.common import bench_parser, cpu_name
from components.cpu_kernels import AVX2_ENV

RESULTS = Path("bench/results/cpu_kernels.json")
MODES = ("avx2", "portable", "native")
REPEATS = int(os.environ.get("BENCH_KERNEL_REPEATS", "3"))
TEXTS, HEAD_STEPS, HEAD_BATCH, CANDIDATES = 2048, 300, 64, 16

# runs in a fresh interpreter per mode: the pin must precede the first `import torch`
_PROBE = """
import hashlib, json, sys, time
from components.cpu_kernels import kernels_in_use, pin_cpu_kernels
pin_cpu_kernels()
import numpy as np, torch
from components.agent.scorer import build_net
from components.buffer.embedders import make_embedder
from components.config import BufferConfig
embedder, texts, steps, batch, k, cand_dim, ctx_dim, hidden = json.loads(sys.argv[1])
torch.set_num_threads(2)
sha = lambda a: hashlib.sha256(np.ascontiguousarray(a).tobytes()).hexdigest()[:16]
words = "open close take drop go north south east west key door chest table lamp".split()
rows = [" ".join(words[(i * 7 + j * 3) % len(words)] for j in range(8 + i % 24))
        for i in range(texts)]
emb = make_embedder(BufferConfig(embedder=embedder))
emb.embed(rows[:8])  # load the model outside the timing
t = time.perf_counter(); vecs = emb.embed(rows); embed_s = time.perf_counter() - t
torch.manual_seed(0)
net = build_net(cand_dim, ctx_dim, hidden)
opt = torch.optim.Adam(net.parameters(), lr=1e-3)
cand, ctx = torch.randn(batch, k, cand_dim), torch.randn(batch, ctx_dim)
mask, target = torch.ones(batch, k), torch.randint(0, k, (batch,))
t = time.perf_counter()
for _ in range(steps):
    opt.zero_grad()
    logits, _ = net(cand, ctx, mask)
    torch.nn.functional.cross_entropy(logits, target).backward()
    opt.step()
head_s = time.perf_counter() - t
weights = torch.cat([p.detach().flatten() for p in net.parameters()]).numpy()
print(json.dumps({"kernels": kernels_in_use(), "embed_s": embed_s, "head_s": head_s,
                  "embed_sha": sha(vecs), "head_sha": sha(weights)}))
"""


def _head_shape() -> dict[str, Any]:
    """The scoring head's embedder and sizes, as params.yaml builds it."""
    from components.agent.loading import new_scorer
    from components.config import PARAMS_FILE, load_config

    cfg = load_config(Path(PARAMS_FILE))
    policy = new_scorer(cfg, seed=0)
    f = policy.featurizer
    return {
        "embedder": cfg.agent.scorer.embedder,
        "candidate_dim": f.candidate_dim,
        "context_dim": f.context_dim,
        "hidden": cfg.agent.scorer.hidden,
    }


def _probe(mode: str, head: dict[str, Any]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "DREAMGYM_CPU_KERNELS"}
    env["DREAMGYM_CPU_KERNELS"] = mode
    for key in AVX2_ENV:
        env.pop(key, None)  # the parent's pin must not decide the child's mode
    sizes = [head["candidate_dim"], head["context_dim"], head["hidden"]]
    arg = json.dumps([head["embedder"], TEXTS, HEAD_STEPS, HEAD_BATCH, CANDIDATES, *sizes])
    out = subprocess.run(
        [sys.executable, "-c", _PROBE, arg], env=env, capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    """Time every mode, alternating; write the JSON."""
    head = _head_shape()
    runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODES}
    for r in range(REPEATS):
        order = MODES if r % 2 == 0 else MODES[::-1]
        for mode in order:
            runs[mode].append(_probe(mode, head))
            print(f"round {r + 1}/{REPEATS} {mode}: {runs[mode][-1]}", flush=True)
    modes = {}
    for mode, rs in runs.items():
        modes[mode] = {
            "kernels": rs[0]["kernels"],
            "embed_s": round(statistics.median(x["embed_s"] for x in rs), 4),
            "head_s": round(statistics.median(x["head_s"] for x in rs), 4),
            "embed_sha": rs[0]["embed_sha"],
            "head_sha": rs[0]["head_sha"],
            # the same mode must give the same bits every time on one host
            "deterministic": len({(x["embed_sha"], x["head_sha"]) for x in rs}) == 1,
        }
    base = modes["avx2"]
    for mode in ("portable", "native"):
        m = modes[mode]
        m["embed_vs_avx2"] = round(m["embed_s"] / base["embed_s"], 3)
        m["head_vs_avx2"] = round(m["head_s"] / base["head_s"], 3)
        m["same_bits_as_avx2"] = (m["embed_sha"], m["head_sha"]) == (
            base["embed_sha"],
            base["head_sha"],
        )
    result = {
        "cpu": cpu_name(),
        "threads": 2,
        "texts": TEXTS,
        "head": {**head, "steps": HEAD_STEPS, "batch": HEAD_BATCH, "candidates": CANDIDATES},
        "repeats": REPEATS,
        "modes": modes,
    }
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    tmp = RESULTS.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(result, indent=2) + "\n")
    tmp.replace(RESULTS)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    bench_parser(
        "bench.cpu_kernels",
        __doc__,
        env={"BENCH_KERNEL_REPEATS": "rounds over the modes; each time is the median (default 3)"},
    ).parse_args()
    main()
