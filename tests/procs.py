"""Linux /proc helpers for the tests that kill or interrupt a process and its pool."""

from __future__ import annotations

from pathlib import Path


def children(pid: int, *, pool_workers_only: bool = False) -> list[int]:
    """The child processes of ``pid``; with ``pool_workers_only`` its spawned pool workers
    (not multiprocessing's resource tracker)."""
    kids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
            cmdline = (stat.parent / "cmdline").read_bytes() if pool_workers_only else b""
        except OSError:
            continue
        spawned = not pool_workers_only or b"spawn_main" in cmdline
        if int(fields[1]) == pid and spawned:
            kids.append(int(stat.parent.name))
    return kids


def alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, exited but not reaped, does not)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"
