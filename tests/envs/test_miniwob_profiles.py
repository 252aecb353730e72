"""A MiniWoB++ browser's temporary profile is removed with its processes, and one a
killed run left behind is swept by the next browser start (stand-in processes that name
the profile dir, as Chromium's do; no browser needed)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from components.envs.miniwob_browser import (
    PROFILE_PREFIX,
    kill_profile_processes,
    sweep_stale_profiles,
)
from tests.procs import alive

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

# writes into the profile until killed, as a Chromium shutting down does
_WRITER = """
import pathlib, sys, time
while True:
    pathlib.Path(sys.argv[1], "Local State").write_text("x")
    time.sleep(0.001)
"""


def _browser(profile: Path) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen([sys.executable, "-c", _WRITER, str(profile)])
    deadline = time.monotonic() + 10
    while not (profile / "Local State").exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    return proc


def test_killing_a_browser_removes_its_profile_after_its_processes_are_gone(tmp_path: Path):
    profile = tmp_path / f"{PROFILE_PREFIX}live"
    profile.mkdir()
    procs = [_browser(profile) for _ in range(3)]
    try:
        kill_profile_processes(str(profile))
        assert not any(alive(p.pid) for p in procs)
        time.sleep(0.2)
        assert not profile.exists()
    finally:
        for p in procs:
            p.kill()
            p.wait()


def test_a_leaked_profile_is_swept_but_never_a_live_or_a_new_one(tmp_path: Path):
    old = time.time() - 2 * 3600
    leaked, live, new = (tmp_path / f"{PROFILE_PREFIX}{n}" for n in ("leaked", "live", "new"))
    for folder in (leaked, live, new):
        (folder / "Default").mkdir(parents=True)
    os.utime(leaked, (old, old))
    os.utime(live, (old, old))
    other = tmp_path / "not-ours"
    other.mkdir()
    os.utime(other, (old, old))
    browser = _browser(live)  # a long run's browser: its profile is old and in use
    try:
        assert sweep_stale_profiles(str(tmp_path)) == 1
        assert not leaked.exists() and live.exists() and new.exists() and other.exists()
    finally:
        browser.kill()
        browser.wait()
