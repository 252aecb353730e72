"""Archive another checkout's run of one env into this project: ``reports/envs/<env>/``.

A run on another env (``dvc exp run -S env.name=scienceworld`` in a clone, or a workspace
of ``flows/envs.py``) writes the same files as the project's own run: Table 1, the
experience model's and the agents' metrics, the report and its figures. The project keeps
its own env's files at the top level and each other env's under ``reports/envs/<env>/``;
``metrics/table1.json`` and ``metrics/policy_fidelity.json`` hold every env's entry side
by side, each with the provenance of the run that made it (``_provenance_by_env``).

``archive_env`` does that in one step: it checks the source's files, replaces
``reports/envs/<env>/`` with them as a whole (plus ``archive.json``: where they came from
and when), and merges the env's entries into the project's two side-by-side files.
Nothing is written until every input has been read and checked.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from components.io import InputError, atomic_outputs, swap_dir

ARCHIVE_ROOT = Path("reports") / "envs"
ARCHIVE_NOTE = "archive.json"  # written by archive_env: source, provenance, files
TABLE1 = Path("metrics") / "table1.json"
POLICY_FIDELITY = Path("metrics") / "policy_fidelity.json"
# the run's files copied as they are: (path in the source, path in the env's archive)
_METRICS = ("data", "drift", "fidelity", "judge", "policy_fidelity", "table1", "theorem1")
_FIGURES = ("drift", "fidelity", "judge", "rl_curves", "success", "theorem1")
RUN_FILES = (
    *((Path("metrics") / f"{name}.json", Path(f"{name}.json")) for name in _METRICS),
    (Path("metrics") / "table1.md", Path("table1.md")),
    (Path("reports") / "report.md", Path("report.md")),
    *((Path("reports") / f"{name}.png", Path(f"{name}.png")) for name in _FIGURES),
)
AGENT_METRICS = Path("metrics") / "agent"  # one JSON per method, all copied to agent/


@dataclass(frozen=True)
class Archived:
    """What ``archive_env`` did: the env, its run's provenance, the files it took."""

    env: str
    provenance: dict[str, Any]
    folder: Path
    copied: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)  # expected but not in the source
    merged: list[str] = field(default_factory=list)  # project files that got the env's entry


def read_json_object(path: Path) -> dict[str, Any] | None:
    """A JSON object file (None if absent); a one-line ``InputError`` if it is not one."""
    if not path.exists():
        return None
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"{path}: not valid JSON ({err}); fix or delete it") from None
    if not isinstance(doc, dict):
        raise InputError(f"{path}: not a JSON object; fix or delete it")
    return doc


def merge_env_entry(project: Mapping[str, Any], source: Mapping[str, Any], env: str) -> dict:
    """``project`` (a side-by-side file: table1 or policy_fidelity) with ``env``'s entry and
    its provenance taken from ``source``; the other envs' entries stay. Unchanged when
    ``source`` has no entry for ``env``. The top-level ``_provenance`` / ``_headline`` stay
    the project's own env's unless the project has none or ``env`` is that env."""
    from components.agent.table1 import keep_other_envs

    entry = source.get(env)
    if not isinstance(entry, dict):
        return dict(project)
    prov = (source.get("_provenance_by_env") or {}).get(env) or source.get("_provenance")
    head = {"_provenance": prov}
    if "_headline" in source:
        head["_headline"] = source["_headline"]
    if env in (source.get("_ci_by_env") or {}):  # Table 1: how its intervals were made
        head["_ci_by_env"] = {env: source["_ci_by_env"][env]}
    merged = keep_other_envs({**head, env: entry}, project, env)
    own_env = (project.get("_provenance") or {}).get("env")
    if own_env and own_env != env:  # the project's top level describes its own env's run
        for key in ("_provenance", "_headline"):
            if key in project:
                merged[key] = project[key]
    return merged


def _run_env(doc: Mapping[str, Any]) -> str | None:
    """The env of the run that wrote a side-by-side metrics file (its ``_provenance.env``)."""
    top = doc.get("_provenance")
    return top.get("env") if isinstance(top, dict) else None


def _source_env(source: Path, env: str | None) -> tuple[str, dict[str, Any], dict[str, Any]]:
    """(env: ``env`` or the one the source's Table 1 was made for, that run's provenance,
    the source's Table 1), checked: the source's run must be of ``env``."""
    table = read_json_object(source / TABLE1)
    if table is None:
        raise ValueError(f"{source / TABLE1} is missing: run the pipeline there first")
    run_env = _run_env(table)
    if not run_env:
        raise ValueError(f"{source / TABLE1} has no _provenance.env: not a table1 stage output")
    env = env or run_env
    if not isinstance(table.get(env), dict):
        raise ValueError(f"{source / TABLE1} has no rows for env {env!r}")
    # the stage metrics copied as they are (data.json, agent/ ...) record no env: the run's
    # env is what they are of; the source's rows of other envs are stale copies
    for rel, doc in (
        (TABLE1, table),
        (POLICY_FIDELITY, read_json_object(source / POLICY_FIDELITY)),
    ):
        made_for = _run_env(doc or {})
        if made_for and made_for != env:
            raise ValueError(
                f"{source / rel} is from a {made_for} run, not {env}: archive it with "
                f"--env {made_for}, or run the {env} pipeline there first"
            )
    prov = (table.get("_provenance_by_env") or {}).get(env) or table["_provenance"]
    return env, prov, table


def archive_env(
    source: Path, root: Path, env: str | None = None, note: str | None = None
) -> Archived:
    """Copy ``source``'s run of ``env`` (default: the env its Table 1 was made for) into
    ``root``'s ``reports/envs/<env>/`` and merge the env's entries into ``root``'s
    metrics/table1.json and metrics/policy_fidelity.json; a run of another env is refused."""
    from components.agent.table1 import markdown as table1_markdown
    from components.evaluation.policy_fidelity import markdown_all

    source, root = Path(source).resolve(), Path(root).resolve()
    if source == root:
        raise ValueError(f"{source} is this project: archive another checkout's run")
    env, prov, table = _source_env(source, env)
    folder = root / ARCHIVE_ROOT / env
    files = [(source / a, Path(b)) for a, b in RUN_FILES]
    agents = sorted((source / AGENT_METRICS).glob("*.json"))
    files += [(p, Path("agent") / p.name) for p in agents]
    for path, _ in files:
        if path.suffix == ".json" and path.exists():
            read_json_object(path)  # a broken file fails here, before anything is written
    copied = [str(dest) for path, dest in files if path.exists()]
    missing = [str(path.relative_to(source)) for path, _ in files if not path.exists()]

    # every project file to rewrite, computed before anything is written
    updates: dict[Path, str] = {}
    merged: list[str] = []
    pf_source = read_json_object(source / POLICY_FIDELITY) or {}
    for rel, doc, render in (
        (TABLE1, table, table1_markdown),
        (POLICY_FIDELITY, pf_source, markdown_all),
    ):
        if not isinstance(doc.get(env), dict):
            continue
        out = merge_env_entry(read_json_object(root / rel) or {}, doc, env)
        updates[root / rel] = json.dumps(out, indent=2, sort_keys=True) + "\n"
        updates[(root / rel).with_suffix(".md")] = render(out)
        merged.append(str(rel))

    record = {
        "env": env,
        "source": str(source),
        "provenance": prov,
        "archived_at": datetime.now(UTC).isoformat(timespec="seconds"),
        "files": copied,
        "missing": missing,
        **({"note": note} if note else {}),
    }
    staged = folder.with_name(f".{env}.{os.getpid()}.{uuid.uuid4().hex[:8]}.tmp")
    try:
        for path, dest in files:
            if path.exists():
                (staged / dest).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(path, staged / dest)
        (staged / ARCHIVE_NOTE).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        swap_dir(staged, folder)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    with atomic_outputs() as temp:
        for path, text in updates.items():
            temp(path).write_text(text, encoding="utf-8")
    return Archived(env, prov, folder, copied, missing, merged)
