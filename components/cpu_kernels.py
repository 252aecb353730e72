"""Pin the CPU math libraries to fixed kernels, so a run's floats do not depend on what
else the host's CPU has (``DREAMGYM_CPU_KERNELS``: ``avx2`` default, ``portable``, ``native``).

Why: torch (ATen), MKL, oneDNN, numpy and its OpenBLAS each pick kernels for the CPU they
start on, and an AVX-512 kernel sums in another order than an AVX2 one. The results
differ in the last bits, and a sampled RL run grows that into other episodes (likely
why two sessions of one commit read DreamGym GRPO 40.7 and 46.9 on the same ScienceWorld games,
their update statistics apart from the 7th digit on).

- ``avx2``: every library on its AVX2 path. A commit's metrics reproduce on any **Intel**
  AVX2 host (no slower on 2 cores). Not across vendors: MKL honours ``MKL_CBWR=AVX2`` on
  Intel CPUs only and takes its AUTO branch elsewhere (oneMKL's CNR guide: on non-Intel
  CPUs only AUTO and COMPATIBLE are supported), which is why an AMD EPYC and an Intel Xeon
  run gave the same SFT rows but other RL rows.
- ``portable``: the same, with MKL on its COMPATIBLE branch (SSE2 without the approximate
  rcpps/rsqrtps), the one branch MKL runs alike on Intel and AMD; its GEMMs are slower.
- ``native``: each library's fastest kernels for this host.

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
PINNED, PORTABLE, NATIVE = "avx2", "portable", "native"
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
# MKL's one branch that runs the same code on Intel and non-Intel CPUs
PORTABLE_ENV = {**AVX2_ENV, "MKL_CBWR": "COMPATIBLE"}
_MODES = {PINNED: AVX2_ENV, PORTABLE: PORTABLE_ENV}
# mkl_cbwr_get's branch codes (oneMKL's mkl_service.h)
_MKL_BRANCH_QUERY = 1
_MKL_BRANCHES = {
    0: "off", 1: "off", 2: "auto", 3: "compatible", 4: "sse2", 8: "sse4_2", 9: "avx", 10: "avx2",
    12: "avx512", 14: "avx512_e1",
}  # fmt: skip


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
    """Set the chosen mode's variables; return ``"avx2"``, ``"portable"`` or ``"native"``."""
    env = os.environ if environ is None else environ
    choice = env.get(ENV_VAR, PINNED).strip().lower()
    if choice == NATIVE:
        return NATIVE
    if choice not in _MODES:
        from components.config import ConfigError

        raise ConfigError(
            f"{ENV_VAR}={choice!r}: use {PINNED!r} (reproducible on Intel), "
            f"{PORTABLE!r} (on Intel and AMD, slower GEMMs) or {NATIVE!r}"
        )
    if not {"avx2", "fma"} <= (_cpu_flags() if flags is None else flags):
        return NATIVE  # not x86 with AVX2: these kernels do not exist here
    wanted = _MODES[choice]
    if "torch" in sys.modules and env is os.environ and not all(k in env for k in wanted):
        log.warning("torch was imported before the CPU kernels were pinned: not reproducible")
    for key, value in wanted.items():
        env.setdefault(key, value)
    return choice


def mkl_branch() -> str | None:
    """The CNR branch MKL runs in this process (None before torch loads, or without MKL)."""
    torch = sys.modules.get("torch")
    if torch is None or not hasattr(torch, "__file__"):
        return None
    import ctypes

    try:  # torch links MKL statically into libtorch_cpu and exports its service calls
        lib = ctypes.CDLL(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so"))
        code = int(lib.mkl_serv_cbwr_get(ctypes.c_int(_MKL_BRANCH_QUERY)))
    except (OSError, AttributeError):
        return None
    return _MKL_BRANCHES.get(code, str(code))


def kernels_in_use(environ: MutableMapping[str, str] | None = None) -> str:
    """What a run records in its provenance: the mode whose variables all hold (with
    ``+mkl-<branch>`` where MKL ignored its variable, as on AMD CPUs), else ``"native"``."""
    env = os.environ if environ is None else environ
    for mode, wanted in _MODES.items():
        if all(env.get(k, "").lower() == v.lower() for k, v in wanted.items()):
            branch = mkl_branch() if environ is None else None  # only this process's MKL
            if branch is not None and branch != wanted["MKL_CBWR"].lower():
                return f"{mode}+mkl-{branch}"
            return mode
    return NATIVE
