"""Tasks a user brings (``tasks.external``): TextWorld game folders and JSONL task lists.

The user's files are read where they are, never moved or written. A game or line that
cannot be used is quarantined with its reasons while the rest load; a path that does
not exist, or a folder without any game, is an error naming it. Every task loaded here
has ``external=True``. Relative paths in the config are relative to the project root;
a relative ``game_file`` inside a task list is relative to the list's own folder.
``Task.game_file`` is written relative to the project root when the game lies under
it, else absolute.
"""

from __future__ import annotations

import base64
import glob
import json
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.config import ExternalTasksConfig
from components.io import InputError
from components.schema import INT32_MAX, Split, Task, stable_id

GAME_SUFFIXES = (".z8", ".ulx")
TEXTWORLD = "textworld"
# a game whose objective is empty still gets an instruction (Task.instruction is required)
GENERIC_INSTRUCTION = "Explore the game and do what it asks of you to win."
QUARANTINE_FILE = "quarantined.jsonl"
MAX_LINE_BYTES = 1_000_000  # a longer task-list line is quarantined unparsed
_GLOB = re.compile(r"[*?\[]")
_SLUG = re.compile(r"[^A-Za-z0-9_-]+")


class ExternalTasksError(InputError):
    """An external task source cannot be used at all (missing path, no game in it)."""


@dataclass
class ExternalTasks:
    """The usable external tasks and the quarantined ones, each with its reasons."""

    tasks: list[Task] = field(default_factory=list)
    quarantined: list[dict[str, Any]] = field(default_factory=list)

    def extend(self, other: ExternalTasks) -> None:
        """Add another source's tasks and quarantine."""
        self.tasks += other.tasks
        self.quarantined += other.quarantined


def _resolve(path: str | Path, base: Path) -> Path:
    p = Path(path).expanduser()
    return p if p.is_absolute() else base / p


def _stored_path(path: Path, root: Path) -> str:
    """Root-relative when under the project root (portable), else absolute."""
    resolved = path.resolve()
    try:
        return resolved.relative_to(root.resolve()).as_posix()
    except ValueError:
        return resolved.as_posix()


def find_games(path: str | Path, root: Path) -> list[Path]:
    """The game files of a folder, a glob or a single game file (sorted)."""
    text = str(path)
    if _GLOB.search(text):
        pattern = text if Path(text).is_absolute() else str(root / text)
        matches = [Path(p) for p in glob.glob(pattern, recursive=True)]
        if not matches:
            raise ExternalTasksError(f"{text}: no file matches this glob")
        games = [p for p in matches if p.is_file() and p.suffix in GAME_SUFFIXES]
    else:
        p = _resolve(text, root)
        if not p.exists():
            raise ExternalTasksError(f"{text}: no such folder or game file")
        if p.is_file():
            games = [p] if p.suffix in GAME_SUFFIXES else []
        else:
            games = [f for f in p.iterdir() if f.is_file() and f.suffix in GAME_SUFFIXES]
    if not games:
        suffixes = "/".join(GAME_SUFFIXES)
        raise ExternalTasksError(f"{text}: no game ({suffixes} with its .json) in it")
    return sorted(games)


def game_task(game: Path, root: Path, split: Split, family: str) -> Task:
    """The Task of one TextWorld game file (raises ValueError saying why it is unusable)."""
    import textworld

    from components.envs.textworld_env import story_file_problem

    meta = game.with_suffix(".json")
    if not meta.is_file():
        raise ValueError(f"{meta.name} missing: TextWorld needs the game's .json beside it")
    if game.suffix == ".ulx":  # found so that it is quarantined with a reason, not skipped
        raise ValueError(
            f"{game.name}: Glulx (.ulx) games need TextWorld < 1.7, this install plays "
            f"Z-machine games only: rebuild it as .z8 (tw-make ... --format z8)"
        )
    if game.suffix.startswith(".z") and (problem := story_file_problem(game)) is not None:
        raise ValueError(problem)
    try:
        tw_game = textworld.Game.load(str(meta))
        walkthrough = list(tw_game.walkthrough or []) if tw_game.quests else []
    except Exception as err:  # TextWorld raises many kinds on a foreign or broken .json
        raise ValueError(f"{meta.name}: not a TextWorld game description ({err})") from err
    objective = " ".join(str(tw_game.objective or "").split())
    stored = _stored_path(game, root)
    return Task(
        task_id=f"ext-{_SLUG.sub('-', game.stem)[:40]}-{stable_id(stored, n=8)}",
        env=TEXTWORLD,
        family=family,
        difficulty=len(walkthrough),
        split=split,
        instruction=objective or GENERIC_INSTRUCTION,
        seed=int(stable_id("external", stored), 16) % INT32_MAX,
        game_file=stored,
        walkthrough=walkthrough or None,
        external=True,
    )


def games_tasks(path: str | Path, root: Path, split: Split, family: str) -> ExternalTasks:
    """Every usable game of a folder or glob; the others quarantined with their reasons."""
    out = ExternalTasks()
    for game in find_games(path, root):
        try:
            out.tasks.append(game_task(game, root, split, family))
        except ValueError as err:
            out.quarantined.append({"source": str(game), "reasons": [str(err)]})
    return out


def _raw(data: bytes) -> dict[str, str]:
    try:
        return {"raw": data.decode("utf-8")}
    except UnicodeDecodeError:
        return {"raw_base64": base64.b64encode(data).decode("ascii")}


def _validation_reasons(err: Exception) -> list[str]:
    errors = getattr(err, "errors", None)
    if callable(errors):
        return [f"{'.'.join(str(x) for x in e['loc']) or 'row'}: {e['msg']}" for e in errors()]
    return [f"{type(err).__name__}: {err}"]


def _parse_line(data: bytes) -> Task:
    if len(data) > MAX_LINE_BYTES:
        raise ValueError(f"line of {len(data)} bytes, over {MAX_LINE_BYTES}")
    try:
        row = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError as err:
        raise ValueError(f"not UTF-8: {err.reason}") from err
    except (ValueError, RecursionError) as err:
        raise ValueError(f"invalid JSON: {err}") from err
    if not isinstance(row, dict):
        raise ValueError(f"a JSON object is expected, got {type(row).__name__}")
    return Task.model_validate(row)


def task_list_tasks(path: str | Path, root: Path, split: Split | None, env: str) -> ExternalTasks:
    """The rows of a JSONL task list; a bad row is quarantined with reasons, never fatal."""
    file = _resolve(path, root)
    if not file.exists():
        raise ExternalTasksError(f"{path}: no such task list")
    if not file.is_file():
        raise ExternalTasksError(f"{path} is a folder, not a JSONL task list")
    out = ExternalTasks()
    for number, data in enumerate(file.read_bytes().splitlines(), start=1):
        if not data.strip():
            continue
        where = {"source": str(file), "line": number}
        try:
            task = _parse_line(data)
        except Exception as err:  # pydantic's ValidationError or ours: both have reasons
            out.quarantined.append({**where, "reasons": _validation_reasons(err), **_raw(data)})
            continue
        reasons = []
        if task.env != env:
            reasons.append(f"env {task.env!r} is not env.name {env!r}")
        update: dict[str, Any] = {"external": True, "split": split or task.split}
        if task.game_file:
            game = _resolve(task.game_file, file.parent)
            if not game.is_file() and _resolve(task.game_file, root).is_file():
                # a list the pipeline wrote (data/tasks/tasks.jsonl): root-relative paths
                game = _resolve(task.game_file, root)
            if env == TEXTWORLD and not game.is_file():
                reasons.append(
                    f"game_file {task.game_file} not found (from {file.parent} or {root})"
                )
            update["game_file"] = _stored_path(game, root)
        if reasons:
            out.quarantined.append({**where, "reasons": reasons, **_raw(data)})
            continue
        out.tasks.append(task.model_copy(update=update))
    return out


def load_external(cfg: ExternalTasksConfig, env: str, root: Path) -> ExternalTasks:
    """Every configured external source, read in config order (games first)."""
    if cfg.games and env != TEXTWORLD:
        raise ExternalTasksError(
            f"tasks.external.games holds TextWorld games but env.name is {env!r}: "
            "use tasks.external.task_lists for this env"
        )
    out = ExternalTasks()
    for games in cfg.games:
        out.extend(games_tasks(games.path, root, games.split, games.family))
    for task_list in cfg.task_lists:
        out.extend(task_list_tasks(task_list.path, root, task_list.split, env))
    return out


def merge_tasks(tasks: Iterable[Task], external: ExternalTasks) -> list[Task]:
    """``tasks`` then the external ones; an external id already taken is quarantined."""
    merged = list(tasks)
    seen = {t.task_id for t in merged}
    for task in external.tasks:
        if task.task_id in seen:
            reason = f"duplicate task_id {task.task_id!r}"
            # the task itself: the row must stay recoverable (its line's text is not kept)
            row = {
                "source": task.game_file,
                "reasons": [reason],
                "task": task.model_dump(mode="json"),
            }
            external.quarantined.append(row)
            continue
        seen.add(task.task_id)
        merged.append(task)
    return merged


def quarantine_text(quarantined: list[dict[str, Any]]) -> str:
    """The quarantine as JSONL, one row per unusable game or line."""
    return "".join(json.dumps(q, sort_keys=True) + "\n" for q in quarantined)
