"""The CPU kernel pin: AVX2 paths set before torch loads, opt-out, and the hosts it skips."""

from __future__ import annotations

import subprocess
import sys

import pytest

from components.config import ConfigError
from components.cpu_kernels import (
    AVX2_ENV,
    ENV_VAR,
    PORTABLE_ENV,
    kernels_in_use,
    pin_cpu_kernels,
)

AVX2_HOST = {"sse4_2", "avx", "avx2", "fma", "avx512f"}


def test_an_avx2_host_gets_every_library_pinned() -> None:
    env: dict[str, str] = {}
    assert pin_cpu_kernels(env, AVX2_HOST) == "avx2"
    assert env == AVX2_ENV and kernels_in_use(env) == "avx2"


def test_portable_differs_from_avx2_only_in_mkls_branch() -> None:
    env = {ENV_VAR: "portable"}
    assert pin_cpu_kernels(env, AVX2_HOST) == "portable"
    assert env["MKL_CBWR"] == "COMPATIBLE"  # the one branch MKL runs alike on Intel and AMD
    assert {k: v for k, v in env.items() if k not in (ENV_VAR, "MKL_CBWR")} == {
        k: v for k, v in AVX2_ENV.items() if k != "MKL_CBWR"
    }
    assert kernels_in_use(env) == "portable" and PORTABLE_ENV["MKL_CBWR"] == "COMPATIBLE"


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
    with pytest.raises(ConfigError, match=f"^{ENV_VAR}='avx512': use 'avx2' .*'portable'"):
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


_MKL_PROBE = (
    "import os\n"
    "from components.cpu_kernels import kernels_in_use, mkl_branch, pin_cpu_kernels\n"
    "pin_cpu_kernels()\n"
    "import torch\n"
    "torch.ones(8, 8) @ torch.ones(8, 8)\n"
    "os.environ['MKL_CBWR'] = os.environ.pop('LATER_MKL_CBWR', os.environ['MKL_CBWR'])\n"
    "print(mkl_branch(), kernels_in_use())\n"
)


@pytest.mark.parametrize(
    ("env", "expected"),
    [
        ({ENV_VAR: "avx2"}, "avx2 avx2"),
        ({ENV_VAR: "portable"}, "compatible portable"),
        # MKL read AUTO (what it does with AVX2 on an AMD CPU): the run does not claim avx2
        ({"MKL_CBWR": "AUTO", "LATER_MKL_CBWR": "AVX2"}, "auto avx2+mkl-auto"),
    ],
)
def test_the_provenance_names_the_branch_mkl_really_runs(
    env: dict[str, str], expected: str
) -> None:
    import os

    from components.cpu_kernels import _cpu_flags

    if not {"avx2", "fma"} <= _cpu_flags():
        pytest.skip("this host has no AVX2 kernels to pin")
    base = {k: v for k, v in os.environ.items() if k not in (*AVX2_ENV, ENV_VAR)}
    out = subprocess.run(
        [sys.executable, "-c", _MKL_PROBE], env={**base, **env}, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    if out.stdout.startswith("None"):
        pytest.skip("this torch build exports no MKL service calls")
    branch, mode = out.stdout.split()
    if env.get(ENV_VAR) == "avx2" and branch == "auto":  # a non-Intel host: MKL fell back
        assert mode == "avx2+mkl-auto"
    else:
        assert f"{branch} {mode}" == expected
