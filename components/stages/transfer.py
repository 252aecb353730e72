"""Cross-environment transfer (paper Fig. 3, middle): a DreamGym policy of one env on another.

Run in the target env's project (``env.name`` = the target) after its pipeline, with
``--source`` the source env's project (its ``models/policy/dreamgym_<algo>/seed-<s>``):

- ``zero_shot``: each seed's source DreamGym policy plays the target's held-out test tasks
  (the evaluate_policy protocol: the same seeds, sampled passes and step limit);
- ``s2r``: each seed's source DreamGym policy continues with RL in the target's real env on
  its train tasks, capped at the target's own S2R budget (``rl.s2r_real_fraction`` x the
  real steps the target's real GRPO used), then plays the same test tasks. ``--reward
  score`` trains that leg on the target's score gains (partial credit) instead of the
  project's ``env.reward``: a foreign policy may win nothing in the budget, leaving every
  GRPO group's rewards equal. Success is still the env's win flag.

Beside them, from the target's own evaluation episodes: random, SFT, DreamGym and S2R in
domain, with paired differences on the same (task, seed) episodes, and the source's
DreamGym success in its own env. The entry ``"<source>-><target>"`` of ``--out`` (default
``metrics/transfer.json``) is replaced; other directions' entries stay.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import Any, get_args

from components.artifacts import (
    RANDOM,
    S2R,
    SFT,
    dreamgym_method,
    episodes_file,
    policy_dir,
    s2r_method,
    seed_dir,
)
from components.config import Config, Paths
from components.config.data import SCORED_ENVS, RewardMode
from components.io import InputError, read_json, read_rows
from components.stages.common import numbers, write_json

log = logging.getLogger("dreamgym")

CODE_ROOT = Path(__file__).resolve().parents[2]
TRANSFER_METRICS = "transfer.json"
TRANSFER_DATA = "transfer"  # data/transfer/<source>-<target>/{zero_shot,s2r}.jsonl
ZERO_SHOT, S2R_KEY = "zero_shot", "s2r"
REWARDS = get_args(RewardMode)  # the valid --reward names, checked before the run


def source_env(source: Paths) -> str:
    """The env a project's pipeline ran on (its task suite's env)."""
    from components.stages.data import load_tasks

    if not source.tasks_file.exists():
        raise FileNotFoundError(f"{source.tasks_file} missing: is {source.root} a project?")
    envs = {t.env for t in load_tasks(source)}
    if len(envs) != 1:
        raise InputError(f"{source.tasks_file}: expected one env, found {sorted(envs)}")
    return envs.pop()


def _source_success(source: Paths, env: str, method: str) -> float | None:
    """The source's own held-out success of ``method`` (its Table 1), if recorded."""
    path = source.metrics / "table1.json"
    if not path.exists():
        return None
    row = read_json(path).get(env, {}).get(method)
    return row.get("success") if row else None


def _read_rows(path: Path) -> list[dict[str, Any]]:
    return read_rows(path) if path.exists() else []


def _summary(rows: list[dict[str, Any]], baselines: dict[str, list[dict[str, Any]]]) -> Any:
    """Sampled success with CI, and paired differences from each baseline's episodes."""
    from components.agent.table1 import SAMPLED, mode_summary, paired_difference

    head = mode_summary(rows, SAMPLED)
    if head is None:
        return None
    for name, base in baselines.items():
        if base:
            diff = paired_difference(rows, base)
            if diff is not None:
                head[f"vs_{name}"] = diff
    return head


def _s2r_seed(
    cfg: Config, paths: Paths, algo: str, seed: int, init_dir: Path, method: str, reward: str
) -> dict[str, Any]:
    """Worker: one seed's S2R from a foreign policy; a run with no update is reported."""
    from components.stages.rl_seed import REAL_RL, NoUpdateError, rl_seed

    # real RL: re-grounding would continue the foreign policy in this env's dream, which is
    # in-domain DreamGym training, not transfer of what the source env taught it
    cfg = cfg.model_copy(
        update={
            "rl": cfg.rl.model_copy(update={"s2r_mode": REAL_RL}),
            "env": cfg.env.model_copy(update={"reward": reward}),
        }
    )
    try:
        result = rl_seed(cfg, paths, algo, S2R, seed, init_dir=init_dir, method=method)
    except NoUpdateError as err:  # e.g. no win in the budget: a result, not a crash
        return {"no_update": str(err), "real_steps": err.real_steps}
    return {k: v for k, v in result.items() if k != "history"}


def s2r_reward(cfg: Config, reward: str | None) -> str:
    """The S2R leg's reward mode: ``reward`` if given (checked), else the project's."""
    if reward is None:
        return cfg.env.reward
    if reward not in REWARDS:
        raise InputError(f"--reward {reward!r}: expected one of {', '.join(REWARDS)}")
    if reward == "score" and cfg.env.name not in SCORED_ENVS:
        raise InputError(
            f"--reward score: {cfg.env.name} keeps no score (only {', '.join(SCORED_ENVS)})"
        )
    return reward


def _previous(out: Path) -> dict[str, Any]:
    """The other directions' entries of ``out`` (a JSON object), read before any work."""
    if out.is_dir():
        raise InputError(f"--out {out} is a folder: name the JSON file to update")
    if not out.exists():
        return {}
    try:
        doc = json.loads(out.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:  # never drop the other directions silently
        raise InputError(f"--out {out}: not valid JSON ({err}); fix or delete it") from None
    if not isinstance(doc, dict):
        raise InputError(f"--out {out}: not a JSON object of directions; fix or delete it")
    return doc


def transfer(
    cfg: Config,
    paths: Paths,
    source: Path,
    algo: str = "grpo",
    out: Path | None = None,
    reward: str | None = None,
) -> dict[str, Any]:
    """Command transfer: zero-shot and S2R transfer of the source env's DreamGym policy."""
    from components.agent.evaluate import held_out_tasks
    from components.agent.loading import is_policy_dir
    from components.agent.table1 import SAMPLED
    from components.io import atomic_write_text
    from components.stages.agent import eval_job
    from components.stages.data import load_tasks
    from components.stages.parallel import run_jobs
    from components.tracking import git_commit, run_provenance, stage_run

    start = time.perf_counter()
    s2r_mode = s2r_reward(cfg, reward)
    out = Path(out) if out is not None else paths.metrics / TRANSFER_METRICS
    _previous(out)  # a bad --out fails now, not after every seed has trained
    src = Paths(Path(source).resolve())
    src_env, dst_env = source_env(src), cfg.env.name
    key = f"{src_env}->{dst_env}"
    dreamgym = dreamgym_method(algo)
    seeds = cfg.seeds_of(dreamgym)
    src_dir = policy_dir(src, dreamgym)
    missing = [s for s in seeds if not is_policy_dir(seed_dir(src_dir, s))]
    if missing:
        raise FileNotFoundError(f"no {dreamgym} policy for seeds {missing} under {src_dir}")
    if not held_out_tasks(load_tasks(paths)):
        raise InputError(f"{paths.tasks_file} has no test split to evaluate on")
    if src_env == dst_env:
        log.warning("source and target are both %s: this is not a cross-env transfer", dst_env)
    s2r_name = f"transfer_s2r_{algo}_from_{src_env}"
    zero_name = f"transfer_zero_shot_{algo}_from_{src_env}"
    episodes_dir = paths.data / TRANSFER_DATA / f"{src_env}-{dst_env}"
    workers = cfg.agent.workers
    with stage_run(
        f"transfer@{algo}", "agent", cfg, ("agent", "env", "rl"), paths.root, {"source": src_dir}
    ) as run:
        log.info("%s: %s zero-shot on %s test tasks", key, dreamgym, dst_env)
        zero = run_jobs(
            eval_job, [(cfg, paths, zero_name, s, (SAMPLED,), src_dir) for s in seeds], workers
        )
        zero_rows = [r for part in zero for r in part]
        log.info("%s: S2R in %s from %s's %s", key, dst_env, src_env, dreamgym)
        jobs = [(cfg, paths, algo, s, seed_dir(src_dir, s), s2r_name, s2r_mode) for s in seeds]
        trained = dict(zip(seeds, run_jobs(_s2r_seed, jobs, workers), strict=True))
        updated = [s for s in seeds if "no_update" not in trained[s]]
        s2r_parts = run_jobs(
            eval_job, [(cfg, paths, s2r_name, s, (SAMPLED,)) for s in updated], workers
        )
        # a seed S2R could not update still ran: its policy is its start, so its S2R row is
        # its zero-shot episodes (left out, the row would average the seeds that learned)
        s2r_rows = [r for part in s2r_parts for r in part] + [
            {**r, "method": s2r_name} for r in zero_rows if r["seed"] not in updated
        ]
        in_domain = {
            m: _read_rows(episodes_file(paths, m))
            for m in (RANDOM, SFT, dreamgym, s2r_method(algo))
        }
        base = {"random": in_domain[RANDOM], "in_domain_dreamgym": in_domain[dreamgym]}
        s2r_summary = _summary(s2r_rows, {**base, "in_domain_s2r": in_domain[s2r_method(algo)]})
        # the code that measured it (outside a checkout: the project's own commit)
        code_sha, code_dirty = git_commit(CODE_ROOT, params_ok=True)
        if code_sha == "unknown":
            code_sha, code_dirty = git_commit(paths.root, params_ok=True)
        entry: dict[str, Any] = {
            "source_env": src_env,
            "target_env": dst_env,
            "algorithm": algo,
            "policy": f"{dreamgym} of {src_env}",
            ZERO_SHOT: _summary(zero_rows, base),
            S2R_KEY: s2r_summary,
            "s2r_training": {
                "reward": s2r_mode,
                "per_seed": {str(s): numbers(trained[s]) for s in updated},
                "seeds_without_update": {
                    str(s): trained[s]["no_update"] for s in seeds if s not in updated
                },
                # every seed's: one without an update spent its real steps too
                "real_steps": sum(trained[s]["real_steps"] for s in seeds) / len(seeds),
            },
            "in_domain": {m: _summary(rows, {}) for m, rows in in_domain.items()},
            "source_in_domain": {dreamgym: _source_success(src, src_env, dreamgym)},
            "eval_seconds": round(time.perf_counter() - start, 2),
            "_provenance": {
                # the target project's run, as every metrics file records it (its params
                # overrides included), and the code that ran
                **run_provenance(paths.root, cfg.profile, dst_env),
                "code_commit": code_sha,
                "code_dirty": code_dirty,
                "target_project": str(paths.root),
                "source_project": str(src.root),
                "target_table1": _table_provenance(paths, dst_env),
                "source_table1": _table_provenance(src, src_env),
            },
        }
        episodes_dir.mkdir(parents=True, exist_ok=True)
        for name, rows in ((ZERO_SHOT, zero_rows), (S2R_KEY, s2r_rows)):
            text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows)
            atomic_write_text(episodes_dir / f"{name}.jsonl", text)
        # read again: another direction may have been written since the check
        write_json(out, {**_previous(out), key: entry})
        run.set_tags({"source_env": src_env, "target_env": dst_env})
        run.log_metrics({k: entry[k] or {} for k in (ZERO_SHOT, S2R_KEY)})
        run.log_dict(entry, f"transfer/{src_env}-{dst_env}.json")
    log.info(
        "%s: zero-shot %s, S2R %s (in-domain DreamGym %s)",
        key,
        _pct(entry[ZERO_SHOT]),
        _pct(s2r_summary),
        _pct(entry["in_domain"][dreamgym]),
    )
    return {"out": str(out), key: entry}


def _pct(row: dict[str, Any] | None) -> str:
    return "n/a" if not row else f"{100 * row['success']:.1f}%"


def _table_provenance(paths: Paths, env: str) -> Any:
    """The provenance of a project's Table 1 rows of ``env`` (the run they come from)."""
    path = paths.metrics / "table1.json"
    if not path.exists():
        return None
    table = read_json(path)
    return table.get("_provenance_by_env", {}).get(env) or table.get("_provenance")
