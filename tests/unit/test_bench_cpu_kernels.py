"""bench/cpu_kernels.py: each mode's probe runs in its own process with that mode's
kernels (not the parent's pin), and a mode gives the same bits twice on one host."""

from __future__ import annotations

import pytest

import bench.cpu_kernels as bench
from components.cpu_kernels import _cpu_flags

HEAD = {"embedder": "wordllama", "candidate_dim": 12, "context_dim": 10, "hidden": 8}


@pytest.fixture(autouse=True)
def _small(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(bench, "TEXTS", 16)
    monkeypatch.setattr(bench, "HEAD_STEPS", 3)
    monkeypatch.setattr(bench, "HEAD_BATCH", 4)
    monkeypatch.setattr(bench, "CANDIDATES", 3)


def test_each_probe_runs_its_own_mode_and_repeats_its_bits() -> None:
    if not {"avx2", "fma"} <= _cpu_flags():
        pytest.skip("this host has no AVX2 kernels to pin")
    portable = bench._probe("portable", HEAD)  # the test process itself is pinned to avx2
    assert portable["kernels"] == "portable"
    again = bench._probe("portable", HEAD)
    assert (again["embed_sha"], again["head_sha"]) == (portable["embed_sha"], portable["head_sha"])
    assert portable["head_s"] > 0 and portable["embed_s"] >= 0
