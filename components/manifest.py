"""Which files of a folder the project wrote, so commands touch only their own files.

Each folder the project writes into beside a user's files (``data/tasks``, its ``games``,
an ``evaluate-external`` output folder) keeps a manifest, ``.dreamgym-manifest.json``:
file name -> sha256 of the content written (``None``: ours whatever the content, e.g. a
game file, or a file claimed before a run that rewrites it). A file the manifest does not
list, or whose content changed since it was written, is the user's: commands never delete
it and never overwrite it without ``--force``.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path

from components.io import InputError, atomic_write_text

MANIFEST_FILE = ".dreamgym-manifest.json"


class NotOursError(InputError):
    """A command would overwrite a file it did not write (rerun with --force to allow it)."""


def _sha256(path: Path) -> str:
    with path.open("rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def read_manifest(folder: Path) -> dict[str, str | None]:
    """File name -> sha256 (or None) of every file the project wrote in ``folder``."""
    path = Path(folder) / MANIFEST_FILE
    if not path.is_file():
        return {}
    try:
        files = json.loads(path.read_text(encoding="utf-8")).get("files", {})
    except (OSError, ValueError, AttributeError):
        return {}  # unreadable: own nothing (the safe side: nothing gets deleted)
    return {str(k): (str(v) if v else None) for k, v in files.items()}


def _write(folder: Path, files: dict[str, str | None]) -> None:
    if (Path(folder) / MANIFEST_FILE).is_file() and files == read_manifest(folder):
        return  # unchanged: left as it is (a reused games folder keeps every mtime)
    Path(folder).mkdir(parents=True, exist_ok=True)
    text = json.dumps({"files": dict(sorted(files.items()))}, indent=1) + "\n"
    atomic_write_text(Path(folder) / MANIFEST_FILE, text)


def record(folder: Path, names: Iterable[str], *, hashed: bool = True) -> None:
    """List ``names`` (files in ``folder``) as written by the project, with their sha256."""
    files = read_manifest(folder)
    for name in names:
        path = Path(folder) / name
        files[name] = _sha256(path) if hashed and path.is_file() else None
    _write(folder, files)


def forget(folder: Path, names: Iterable[str]) -> None:
    """Drop ``names`` from the manifest (after deleting them)."""
    files = read_manifest(folder)
    for name in names:
        files.pop(name, None)
    _write(folder, files)


def is_ours(folder: Path, name: str, manifest: dict[str, str | None] | None = None) -> bool:
    """``folder/name`` is absent, or the project wrote it and nobody changed it since."""
    path = Path(folder) / name
    if not path.exists():
        return True
    files = read_manifest(folder) if manifest is None else manifest
    if name not in files:
        return False
    digest = files[name]
    return digest is None or (path.is_file() and _sha256(path) == digest)


def claim(folder: Path, names: Iterable[str], *, force: bool, what: str) -> None:
    """Make sure the files ``names`` may be (re)written, then claim them (content None).

    Raises ``NotOursError`` naming the first file that is the user's, unless ``force``, and
    ``InputError`` when ``folder`` is a file.
    The claim keeps a run interrupted between writing and ``record`` from locking itself
    out of its own file.
    """
    names = list(names)
    if Path(folder).exists() and not Path(folder).is_dir():  # checked before any work
        raise InputError(f"{folder} is a file, not a folder: name a folder for the outputs")
    files = read_manifest(folder)
    if not force:
        for name in names:
            if not is_ours(folder, name, files):
                raise NotOursError(
                    f"{Path(folder) / name} was not written by {what} (or was edited since): "
                    "move it away, or rerun with --force to overwrite it"
                )
    _write(folder, files | dict.fromkeys(names))
