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
    profile_dir = tempfile.mkdtemp(prefix="dreamgym-miniwob-")
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


def kill_profile_processes(profile_dir: str) -> None:
    """Kill the chromedriver and the Chromium processes of this profile dir, remove it."""
    marker = profile_dir.encode()
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            cmdline = (proc / "cmdline").read_bytes()
        except OSError:
            continue
        if marker in cmdline:
            with contextlib.suppress(OSError):
                os.kill(int(proc.name), signal.SIGKILL)
    shutil.rmtree(profile_dir, ignore_errors=True)


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
