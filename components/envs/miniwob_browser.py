"""Headless Chromium for MiniWoB: start it on its own temporary profile, kill it for good.

Debian's ``chromium`` and ``chromium-driver`` (``make system-deps``), driven by Selenium
with no driver download (``SE_OFFLINE``) and no background networking. One profile dir
per browser: ``kill_profile_processes`` kills every process whose command line names it.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from components.envs.base import EnvError

DEFAULT_CHROME = "/usr/lib/chromium/chromium"  # the real binary; /usr/bin/chromium is a wrapper
DEFAULT_CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    # the machine has no network: without these Chromium keeps dialing Google services
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--window-size=500,400",
)


def start_chromium(chrome_binary: str, chromedriver: str, timeout_s: float) -> tuple[Any, str]:
    """A headless Chromium driver on a fresh temporary profile dir: (driver, profile dir)."""
    os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must never download
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (chrome_binary, chromedriver):
        if not Path(path).exists():
            raise EnvError(
                f"{path} not found: install chromium + chromium-driver (make system-deps)"
            )
    sweep_stale_profiles()  # a kill -9 leaves its browser's profile behind
    profile_dir = tempfile.mkdtemp(prefix=PROFILE_PREFIX)
    options = webdriver.ChromeOptions()
    for flag in CHROME_FLAGS:
        options.add_argument(flag)
    options.add_argument(f"--user-data-dir={profile_dir}")
    options.binary_location = chrome_binary
    try:
        driver = webdriver.Chrome(service=Service(executable_path=chromedriver), options=options)
        driver.set_page_load_timeout(timeout_s)
        driver.set_script_timeout(timeout_s)
    except Exception as err:
        kill_profile_processes(profile_dir)
        raise EnvError(f"cannot start headless Chromium: {err}") from err
    return driver, profile_dir


PROFILE_PREFIX = "dreamgym-miniwob-"
STALE_PROFILE_S = 3600.0  # a profile dir this old with no process naming it was leaked
KILL_WAIT_S = 15.0  # an upper bound: a SIGKILLed process is normally gone in milliseconds


def _pids_naming(marker: bytes) -> list[int]:
    """The live processes whose command line holds ``marker``."""
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            pids.append(int(proc.name))
    return pids


def _running(pid: int) -> bool:
    """Whether ``pid`` still runs (a zombie has stopped: it writes nothing more)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def kill_profile_processes(profile_dir: str) -> None:
    """Kill the chromedriver and the Chromium processes of this profile dir, remove it."""
    marker = profile_dir.encode()
    # a Chromium still shutting down writes into its profile: removing the dir before
    # they are gone left a half-removed one behind (one per Ctrl-C'd browser). Rescan
    # until none is left: a zygote may fork a renderer after the first scan, and a
    # process blocked in a disk write on a busy machine dies only when the write ends
    deadline = time.monotonic() + KILL_WAIT_S
    while (pids := [pid for pid in _pids_naming(marker) if _running(pid)]) and (
        time.monotonic() < deadline
    ):
        for pid in pids:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    shutil.rmtree(profile_dir, ignore_errors=True)


def sweep_stale_profiles(root: str | None = None, max_age_s: float = STALE_PROFILE_S) -> int:
    """Remove profile dirs that a killed run left (older than ``max_age_s``, no process
    names them); returns how many."""
    removed = 0
    now = time.time()
    for folder in Path(root or tempfile.gettempdir()).glob(PROFILE_PREFIX + "*"):
        try:
            old = now - folder.stat().st_mtime > max_age_s
        except OSError:
            continue
        if old and folder.is_dir() and not _pids_naming(str(folder).encode()):
            shutil.rmtree(folder, ignore_errors=True)
            removed += 1
    return removed


def quit_driver(driver: Any) -> None:
    """Quit a driver that may have crashed, then make sure its chromedriver is gone."""
    pid = None
    with contextlib.suppress(Exception):
        pid = driver.service.process.pid
    with contextlib.suppress(Exception):
        driver.quit()
    if pid is not None:
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
