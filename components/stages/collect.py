"""Stage collect: components/stages/data.py's ``collect``, on episodes of the current env
settings only.

data/raw is persisted (dvc.yaml) and resumed by episode id, and an id does not hash every
env setting (``env.scienceworld.simplifications``, ``max_admissible``,
``env.miniwob.max_elements`` ...): ids seed other things, so they stay as they are. The
settings an episode depends on are recorded in ``data/raw/env_settings.json`` instead; when
they differ from the current ones, the episodes collected under the old ones are moved
aside (``data/raw-aside-<time>/``, never read by the pipeline) and collection starts afresh.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

from components.config import Config, Paths
from components.config.data import AGENTGYM_ENVS
from components.io import (
    atomic_write_text,
    output_lock,
    read_settings_record,
    unused_stamped_dir,
)

log = logging.getLogger("dreamgym")

ENV_SETTINGS_FILE = "env_settings.json"  # in data/raw, beside the episodes (not *.jsonl)
ASIDE_PREFIX = "raw-aside-"
# the settings section each env reads (textworld: only the top-level keys)
ENV_SECTION = {"scienceworld": "scienceworld", "miniwob": "miniwob"} | {
    e: "agentgym" for e in AGENTGYM_ENVS
}
# keys that do not change what an episode of a planned task is: the task suite's size
# (the plan drops episodes of tasks no longer in the suite) and how the env is reached
NOT_EPISODE_KEYS = {
    "scienceworld": {"task_names", "variations"},
    "miniwob": {"task_names", "seeds", "chrome_binary", "chromedriver", "timeout_s"},
    "agentgym": {"url_env", "base_url", "timeout_s", "max_retries", "backoff_s", "splits"},
}


def episode_settings(cfg: Config) -> dict[str, Any]:
    """The env settings the collected episodes depend on (a new key counts by default)."""
    env = cfg.env.model_dump(mode="json")
    out = {k: v for k, v in env.items() if not isinstance(v, dict)}
    section = ENV_SECTION.get(cfg.env.name)
    if section is not None:
        skip = NOT_EPISODE_KEYS.get(section, set())
        out[section] = {k: v for k, v in env[section].items() if k not in skip}
    return out


def _flat(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        key = f"{prefix}{k}"
        out.update(_flat(v, f"{key}.") if isinstance(v, dict) else {key: v})
    return out


def _changed(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    a, b = _flat(old), _flat(new)
    return sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))


def check_env_settings(cfg: Config, raw: Path) -> Path | None:
    """Record the current env settings in ``raw``; episodes collected under other ones are
    moved to a new folder beside it first (returned; None when nothing was moved)."""
    settings = episode_settings(cfg)
    record = raw / ENV_SETTINGS_FILE
    old = read_settings_record(record)
    episodes = sorted(raw.glob("*.jsonl")) if raw.is_dir() else []
    aside = None
    if old is None and episodes:
        # collected before the settings were recorded: nothing says they differ
        log.info("collect: %s records no env settings; taking the current ones", raw)
    elif old is not None and old != settings and episodes:
        aside = unused_stamped_dir(raw.parent / ASIDE_PREFIX)
        raw.rename(aside)  # one rename: a kill leaves the episodes in one place or the other
        # not the project's files: git leaves the folder out of `git status`
        (aside / ".gitignore").write_text("*\n", encoding="utf-8")
        log.warning(
            "collect: env settings changed since %s was collected (%s): its %d episode "
            "files are moved to %s; collecting afresh",
            raw,
            ", ".join(_changed(old, settings)) if old else "its record is unreadable",
            len(episodes),
            aside,
        )
    raw.mkdir(parents=True, exist_ok=True)
    if old != settings:
        atomic_write_text(record, json.dumps(settings, indent=2, sort_keys=True) + "\n")
    return aside


def collect(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage collect: real trajectories from expert/noisy/random policies under data/raw."""
    from components.data.collect import plan_episodes
    from components.stages.data import collect as collect_episodes
    from components.stages.data import load_tasks

    aside = None
    # an unusable suite or an empty plan fails in the stage itself, before anything moves
    if plan_episodes(cfg, load_tasks(paths)):
        with output_lock(paths.raw, command="collect"):
            aside = check_env_settings(cfg, paths.raw)
    summary = collect_episodes(cfg, paths)
    if aside is not None:
        summary["set_aside"] = str(aside)
    return summary
