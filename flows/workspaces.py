"""Per-env workspaces: a git worktree of the project's HEAD with its own params.yaml.

Two pipelines in one checkout would clobber each other: the same ``data/``, ``models/``,
``metrics/``, ``dvc.lock`` and MLflow store, and DVC locks the repository for one
``dvc repro`` at a time. Each env therefore runs in its own workspace under
``orchestration.workspaces`` (``.workspaces/<env>``, ignored by git and DVC): a detached
git worktree of HEAD (the committed code), the project's current params.yaml (uncommitted
parameter edits included) with the env's overrides (``env.name`` ...), and its own DVC
outputs, cache, lock and ``mlflow.db``. A workspace is reused by later runs (DVC reruns
only what is stale); when HEAD has moved it follows it, keeping the files it changed
itself (its dvc.lock and the outputs git tracks), so DVC still knows what it built.
"""

from __future__ import annotations

import io
import re
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from components.config import PARAMS_FILE, ConfigError, load_config


class WorkspaceError(RuntimeError):
    """A workspace could not be prepared (the message says why in one line)."""


def git(cwd: Path, *args: str) -> str:
    """``git args`` in ``cwd``; its stdout, or a one-line ``WorkspaceError``."""
    proc = subprocess.run(["git", *args], cwd=cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        why = (proc.stderr.strip().splitlines() or ["no message"])[-1]
        raise WorkspaceError(f"git {' '.join(args[:2])} in {cwd}: {why}")
    return proc.stdout.strip()


def head_commit(root: Path) -> str:
    """The commit checked out at ``root``."""
    return git(root, "rev-parse", "HEAD")


def render_params(src: Path, overrides: Mapping[str, Any]) -> str:
    """``src`` (params.yaml, comments kept) with dotted-key ``overrides``, validated.

    ``{"env.name": "scienceworld", "profile": "ci"}`` sets ``env: name:`` and ``profile:``;
    the result is validated like any params.yaml: a wrong key or value is a one-line
    ``ConfigError`` naming the key and the overrides (nothing is written anywhere).
    """
    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip: the workspace's params.yaml keeps the project's comments
    params = yaml.load(src.read_text(encoding="utf-8"))
    for key, value in overrides.items():
        *parents, leaf = key.split(".")
        node = params
        for part in parents:
            if not isinstance(node.get(part), Mapping):
                raise WorkspaceError(f"{key}: {part!r} is not a section of {src.name}")
            node = node[part]
        node[leaf] = value
    for overlay in _active_overlays(params):
        for key, value in overrides.items():
            if key not in SELECTORS:
                _set_where_defined(overlay, key.split("."), value)
    text = io.StringIO()
    yaml.dump(params, text)
    with tempfile.TemporaryDirectory(prefix="dreamgym-params-") as tmp:
        staged = Path(tmp) / PARAMS_FILE
        staged.write_text(text.getvalue(), encoding="utf-8")
        try:
            load_config(staged)
        except ConfigError as err:
            raise ConfigError(_about_overrides(str(err), staged, src, overrides)) from None
    return text.getvalue()


SELECTORS = ("profile", "env.name")  # they choose the overlays below, at the top level


def _active_overlays(params: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """The overlays ``load_config`` merges over the top level: the env's ``env_overrides``
    entry and the active profile's (a key they set wins over the top-level one)."""
    profile = (params.get("profiles") or {}).get(params.get("profile", "cpu")) or {}
    env = {**(params.get("env") or {}), **(profile.get("env") or {})}.get("name", "textworld")
    env_overlay = (params.get("env_overrides") or {}).get(env) or {}
    return [o for o in (env_overlay, profile) if isinstance(o, Mapping)]


def _set_where_defined(overlay: Any, path: list[str], value: Any) -> None:
    """Set ``path`` in ``overlay`` to ``value`` if the overlay sets it (it would win)."""
    node = overlay
    for part in path[:-1]:
        node = node.get(part) if isinstance(node, Mapping) else None
    if isinstance(node, Mapping) and path[-1] in node:
        node[path[-1]] = value


def _about_overrides(message: str, staged: Path, src: Path, overrides: Mapping[str, Any]) -> str:
    """``load_config``'s message about the staged file, told about ``src`` and the overrides:
    no hint to ``git checkout`` a file that only ever existed in a temporary folder."""
    message = re.sub(rf" \([^()]*git checkout {re.escape(str(staged))}\)$", "", message)
    shown = ", ".join(f"{key}={value!r}" for key, value in overrides.items()) or "no overrides"
    return message.replace(str(staged), f"{src.name} with {shown}")


def set_params(src: Path, dst: Path, overrides: Mapping[str, Any]) -> None:
    """Write ``src`` to ``dst`` with dotted-key ``overrides`` (``render_params``); ``dst`` is
    left as it was when they are invalid."""
    dst.write_text(render_params(src, overrides), encoding="utf-8")


def _follow(workspace: Path, commit: str) -> None:
    """Check ``commit`` out in ``workspace``, keeping the tracked files the workspace changed."""
    changed = git(workspace, "diff", "--name-only", "HEAD").splitlines()
    kept = {p: (workspace / p).read_bytes() for p in changed if (workspace / p).is_file()}
    git(workspace, "checkout", "--quiet", "--detach", "--force", commit)
    for rel, data in kept.items():
        (workspace / rel).parent.mkdir(parents=True, exist_ok=True)
        (workspace / rel).write_bytes(data)


def prepare_workspace(root: Path, workspace: Path, overrides: Mapping[str, Any]) -> Path:
    """Create (or bring to HEAD) the worktree ``workspace`` of ``root`` and write its params.

    The params are validated first: invalid ones (``ConfigError``) leave no new worktree and
    an existing workspace's params.yaml untouched. Returns the workspace's absolute path.
    Not safe to call twice at once for one repository (git locks its worktree list): the
    flow prepares every workspace before fanning out.
    """
    root = Path(root).resolve()
    workspace = (root / workspace).resolve()
    # first the params, so a bad override (an unknown env ...) leaves no worktree behind
    params = render_params(root / PARAMS_FILE, overrides)
    commit = head_commit(root)
    if (workspace / ".git").exists():
        if head_commit(workspace) != commit:
            _follow(workspace, commit)
    else:
        if workspace.exists() and any(workspace.iterdir()):
            raise WorkspaceError(f"{workspace} exists and is not a git worktree: remove it")
        workspace.parent.mkdir(parents=True, exist_ok=True)
        git(root, "worktree", "prune")  # a workspace folder deleted by hand is forgotten
        git(root, "worktree", "add", "--quiet", "--detach", str(workspace), commit)
    (workspace / PARAMS_FILE).write_text(params, encoding="utf-8")
    return workspace


def uncommitted_code(root: Path) -> list[str]:
    """Tracked files changed since HEAD that a workspace does not get (params.yaml and DVC's
    own files aside): the workspaces run HEAD's code."""
    own = {PARAMS_FILE, "dvc.lock"}
    changed = git(Path(root), "diff", "--name-only", "HEAD").splitlines()
    return [p for p in changed if p not in own and not p.startswith(("metrics/", "reports/"))]
