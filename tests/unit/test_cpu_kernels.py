"""The CPU kernel pin: AVX2 paths set before torch loads, opt-out, and the hosts it skips."""

from __future__ import annotations

import subprocess
import sys

import pytest

from components.config import ConfigError
from components.cpu_kernels import AVX2_ENV, ENV_VAR, kernels_in_use, pin_cpu_kernels

AVX2_HOST = {"sse4_2", "avx", "avx2", "fma", "avx512f"}


def test_an_avx2_host_gets_every_library_pinned() -> None:
    env: dict[str, str] = {}
    assert pin_cpu_kernels(env, AVX2_HOST) == "avx2"
    assert env == AVX2_ENV and kernels_in_use(env) == "avx2"


def test_a_variable_the_user_set_wins_and_the_run_is_not_recorded_as_pinned() -> None:
    env = {"ATEN_CPU_CAPABILITY": "avx512"}
    pin_cpu_kernels(env, AVX2_HOST)
    assert env["ATEN_CPU_CAPABILITY"] == "avx512" and env["MKL_CBWR"] == "AVX2"
    assert kernels_in_use(env) == "native"


@pytest.mark.parametrize("flags", [set(), {"sse4_2", "avx"}])  # not x86 / x86 without AVX2
def test_a_host_without_avx2_keeps_its_native_kernels(flags: set[str]) -> None:
    env: dict[str, str] = {}
    assert pin_cpu_kernels(env, flags) == "native" and env == {}


def test_native_opts_out_and_a_typo_is_a_one_line_config_error() -> None:
    env = {ENV_VAR: "Native"}
    assert pin_cpu_kernels(env, AVX2_HOST) == "native" and env == {ENV_VAR: "Native"}
    with pytest.raises(ConfigError, match=f"^{ENV_VAR}='avx512': use 'avx2'"):
        pin_cpu_kernels({ENV_VAR: "avx512"}, AVX2_HOST)


def test_a_stage_process_runs_torch_and_numpy_on_their_avx2_kernels() -> None:
    from components.cpu_kernels import _cpu_flags

    if not {"avx2", "fma"} <= _cpu_flags():
        pytest.skip("this host has no AVX2 kernels to pin")
    code = (
        "import os\n"
        f"for k in {(*AVX2_ENV, ENV_VAR)!r}:\n"
        "    os.environ.pop(k, None)\n"
        "from components.cli_process import offline_and_quiet\n"
        "offline_and_quiet()\n"
        "import torch\n"
        "from numpy._core._multiarray_umath import __cpu_features__ as npy\n"
        "print(torch.backends.cpu.get_cpu_capability(), npy.get('X86_V4', False))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "AVX2 False"  # numpy's AVX-512 dispatch is off too
    assert "cannot disable" not in out.stderr  # every name is one numpy dispatches
