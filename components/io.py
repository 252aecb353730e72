"""Atomic outputs and per-output locks, shared by every stage that writes files.

Atomic: an output is written to a unique temporary file in its own folder (same
filesystem, so the rename is atomic), flushed to disk, then renamed over the old one. A
crash, a full disk or a permission error leaves the previous output intact and removes
the temporary file. ``atomic_outputs`` does this for several files of one stage: every
file is written first, and only when all of them succeeded are they renamed in turn.

Locks: ``output_lock`` holds an OS file lock (``filelock``, released by the kernel when
the process dies, so a lock is never stale) beside each output for the whole run; a
second run on the same outputs fails at once with ``OutputBusyError``.
"""

from __future__ import annotations

import json
import os
import re
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TMP_SUFFIX = ".tmp"


class OutputBusyError(RuntimeError):
    """Another run holds the lock of an output this run would write."""


class InputError(ValueError):
    """An input path cannot be used as given (e.g. a folder where a file is expected)."""


class OutputWriteError(OSError):
    """Writing an output failed (disk full, permission denied, read-only...); names the output."""


def damaged(where: str | Path, what: str, err: BaseException | None = None) -> InputError:
    """The one-line error for a pipeline file that cannot be read as its stage wrote it."""
    text = str(err).strip() if err is not None else ""
    detail = f" ({text.splitlines()[0][:200]})" if text else ""
    return InputError(
        f"{where}: {what}{detail}: the file is damaged; rerun the stage that writes it "
        "(`dvc repro --force <stage>`) or restore it"
    )


def read_json(path: Path) -> Any:
    """A JSON file the pipeline wrote; unreadable JSON or UTF-8 is an ``InputError``."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except ValueError as err:  # JSONDecodeError and UnicodeDecodeError are ValueErrors
        raise damaged(path, "not valid JSON", err) from None


def read_rows(path: Path) -> list[Any]:
    """The rows of a JSON-lines file the pipeline wrote, unvalidated (blank lines skipped);
    a line that is not JSON, or bytes that are not UTF-8, are an ``InputError`` naming it.
    ``components.schema.read_jsonl`` reads typed records."""
    rows = []
    try:
        with Path(path).open(encoding="utf-8") as f:
            for n, line in enumerate(f, 1):
                if line.strip():
                    rows.append(json_line(line, path, n))
    except UnicodeDecodeError as err:
        raise damaged(path, "not UTF-8 text", err) from None
    return rows


def json_line(line: str, path: Path, n: int) -> Any:
    """Line ``n`` of the JSON-lines file ``path``, parsed; an ``InputError`` if it is not JSON."""
    try:
        return json.loads(line.rstrip("\r\n"))  # positions in the message: within the line
    except ValueError as err:
        raise damaged(f"{path}:{n}", "not a JSON line", err) from None


def temp_path_for(path: Path) -> Path:
    """A fresh hidden name beside ``path``: ``.<name>.<pid>.<random>.tmp`` (never shared)."""
    return path.with_name(f".{path.name}.{os.getpid()}.{uuid.uuid4().hex[:12]}{TMP_SUFFIX}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # exists, another user's
    return True


def remove_stale_temps(folder: Path) -> int:
    """Delete the temporary files of writers that died in ``folder``; returns how many."""
    n = 0
    if folder.is_dir():
        for tmp in folder.glob(f".*{TMP_SUFFIX}"):
            parts = tmp.name.rsplit(".", 3)  # [".<name>", "<pid>", "<random>", "tmp"]
            if len(parts) != 4 or not parts[1].isdigit() or not tmp.is_file():
                continue  # not one of ours
            if int(parts[1]) != os.getpid() and _alive(int(parts[1])):
                continue  # a live writer's (another run without the lock)
            tmp.unlink(missing_ok=True)
            n += 1
    return n


def _fsync_path(path: Path, directory: bool = False) -> None:
    fd = os.open(path, os.O_RDONLY | (os.O_DIRECTORY if directory else 0))
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _named(err: OSError, path: Path) -> OSError:
    """The same error, naming the final output instead of its temporary file."""
    code = err.errno
    if code is None:  # pyarrow puts the errno in its message only
        found = re.search(r"errno (\d+)", str(err), re.IGNORECASE)
        code = int(found.group(1)) if found else None
    if code is None:
        detail = str(err).splitlines()[0] if str(err) else repr(err)
        return OutputWriteError(f"cannot write {path}: {detail}")
    return OutputWriteError(code, os.strerror(code), str(path))


@contextmanager
def atomic_outputs() -> Iterator[Callable[[Path], Path]]:
    """Yield ``temp(final) -> tmp path``; on success every tmp replaces its final path."""
    staged: list[tuple[Path, Path]] = []

    def temp(final: Path) -> Path:
        final = Path(final)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = temp_path_for(final)
        staged.append((tmp, final))
        # created here (O_EXCL, umask-respecting mode) so every writer just overwrites it
        os.close(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
        return tmp

    current: Path | None = None
    try:
        yield temp
        for tmp, final in staged:
            current = final
            _fsync_path(tmp)
        for tmp, final in staged:
            current = final
            os.replace(tmp, final)
        for folder in {final.parent for _, final in staged}:
            _fsync_path(folder, directory=True)
    except OSError as err:
        temps = {str(tmp): final for tmp, final in staged}
        if err.filename is not None and str(err.filename) in temps:
            current = temps[str(err.filename)]
        elif err.filename is None and current is None and staged:
            current = staged[-1][1]  # a writer that does not say which file: the last opened
        if current is None:
            raise  # an error about another path (e.g. an input): it names that path itself
        raise _named(err, current) from err
    finally:
        for tmp, _ in staged:
            tmp.unlink(missing_ok=True)


@contextmanager
def atomic_path(path: Path) -> Iterator[Path]:
    """A temporary path to write ``path``'s new content to; renamed over it on success."""
    with atomic_outputs() as temp:
        yield temp(path)


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: Path, text: str) -> None:
    """Replace ``path`` with UTF-8 ``text`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def swap_dir(staged: Path, target: Path) -> None:
    """Put the folder ``staged`` at ``target``; the old one (if any) is removed only after
    the swap, so a kill at any point leaves a whole folder there, old or new."""
    import shutil

    target = Path(target)
    old = target.with_name(f".{target.name}.{os.getpid()}.{uuid.uuid4().hex[:8]}.old")
    if target.exists():
        os.replace(target, old)
    target.parent.mkdir(parents=True, exist_ok=True)
    os.replace(staged, target)
    shutil.rmtree(old, ignore_errors=True)


def read_settings_record(path: Path) -> dict[str, Any] | None:
    """A stage's recorded settings (a JSON object): None when absent, {} when unreadable."""
    try:
        doc = json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError):  # unknown settings: the caller treats them as changed
        return {}
    return doc if isinstance(doc, dict) else {}


def unused_stamped_dir(base: Path) -> Path:
    """``<base><time stamp>`` (then ``-2``, ``-3``...): a folder name no path holds yet."""
    import time

    base = Path(base)
    stamp = time.strftime("%Y%m%d-%H%M%S")
    target, n = base.with_name(f"{base.name}{stamp}"), 1
    while target.exists():
        n += 1
        target = base.with_name(f"{base.name}{stamp}-{n}")
    return target


def lock_path_for(output: Path) -> Path:
    """The lock file of an output: hidden, beside it (never inside a DVC output folder)."""
    return output.parent / f".{output.name}.lock"


@contextmanager
def output_lock(*outputs: Path, command: str) -> Iterator[None]:
    """Hold the lock of every output for the block; ``OutputBusyError`` if another run has one."""
    from filelock import FileLock, Timeout

    held: list[FileLock] = []
    try:
        # one order for every process: two runs locking overlapping outputs cannot deadlock
        for output in sorted({Path(o).absolute() for o in outputs}):
            output.parent.mkdir(parents=True, exist_ok=True)
            lock = FileLock(lock_path_for(output), timeout=0)
            try:
                lock.acquire()
            except Timeout:
                raise OutputBusyError(
                    f"{output} is being written by another run (`dreamgym {command}`?): wait "
                    f"for it to finish, then rerun (lock file {lock_path_for(output)})"
                ) from None
            held.append(lock)
        yield
    finally:
        for lock in reversed(held):
            lock.release()
