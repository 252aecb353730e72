"""Pin the CPU math libraries to their AVX2 kernels, so a run's floats are the same on
every x86 host with AVX2 (default; ``DREAMGYM_CPU_KERNELS=native`` opts out).

Why: torch (ATen), MKL, oneDNN, numpy and its OpenBLAS each pick kernels for the CPU they
start on, and an AVX-512 kernel sums in another order than an AVX2 one. The results
differ in the last bits, and a sampled RL run grows that into other episodes (likely
why two sessions of one commit read DreamGym GRPO 40.7 and 46.9 on the same ScienceWorld games,
their update statistics apart from the 7th digit on). With the kernels pinned, a commit's
metrics can be reproduced on any AVX2 machine (no slower on 2 cores of an AVX-512 EPYC).

The libraries read these variables when they load, so the pin must come before the first
``import torch`` (the ``dreamgym`` commands set it first; spawned workers inherit it).
"""

from __future__ import annotations

import logging
import os
import platform
import sys
from collections.abc import MutableMapping

log = logging.getLogger("dreamgym")

ENV_VAR = "DREAMGYM_CPU_KERNELS"
PINNED, NATIVE = "avx2", "native"
# each library's own switch to its AVX2 code path (a variable the user set wins)
AVX2_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",  # torch's vectorised ops
    "MKL_CBWR": "AVX2",  # MKL's conditional numerical reproducibility: matmuls
    "ONEDNN_MAX_CPU_ISA": "AVX2",
    "OPENBLAS_CORETYPE": "Haswell",  # numpy's BLAS
    # numpy's own ufuncs (exp, log, sums): its AVX-512 paths off, so it runs X86_V3 (AVX2).
    # Only the names numpy 2.x dispatches: any other name prints a warning at every import.
    "NPY_DISABLE_CPU_FEATURES": "X86_V4,AVX512_ICL,AVX512_SPR",
}


def _cpu_flags() -> set[str]:
    """This host's CPU feature flags (empty off Linux x86, where the pin does not apply)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return set()
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def pin_cpu_kernels(
    environ: MutableMapping[str, str] | None = None, flags: set[str] | None = None
) -> str:
    """Set the AVX2 variables (unless opted out); return ``"avx2"`` or ``"native"``."""
    env = os.environ if environ is None else environ
    choice = env.get(ENV_VAR, PINNED).strip().lower()
    if choice == NATIVE:
        return NATIVE
    if choice != PINNED:
        from components.config import ConfigError

        raise ConfigError(f"{ENV_VAR}={choice!r}: use {PINNED!r} (reproducible) or {NATIVE!r}")
    if not {"avx2", "fma"} <= (_cpu_flags() if flags is None else flags):
        return NATIVE  # not x86 with AVX2: these kernels do not exist here
    if "torch" in sys.modules and env is os.environ and not all(k in env for k in AVX2_ENV):
        log.warning("torch was imported before the CPU kernels were pinned: not reproducible")
    for key, value in AVX2_ENV.items():
        env.setdefault(key, value)
    return PINNED


def kernels_in_use(environ: MutableMapping[str, str] | None = None) -> str:
    """What a run records in its provenance: ``"avx2"`` when pinned, else ``"native"``."""
    env = os.environ if environ is None else environ
    pinned = all(env.get(k, "").lower() == v.lower() for k, v in AVX2_ENV.items())
    return PINNED if pinned else NATIVE
