"""Flows: one per stage family, the whole ``pipeline``, and the ``nightly_refresh``.

All of them run DVC stages (flows/stages.py) under one MLflow parent run, so the MLflow
UI shows a pipeline run with a nested run per stage. ``nightly_refresh`` collects fresh
real trajectories, refreshes the buffer, fine-tunes and evaluates the experience model,
and promotes it to ``champion`` when its held-out fidelity is better (promotion rule in
components/evaluation/promotion.py).
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from prefect import flow, get_run_logger

from components.config import PARAMS_FILE, ConfigError, load_config
from components.tracking import pipeline_run
from flows.cli import one_line_errors
from flows.stages import DVC_FILE, family_stages, run_stages, stage_order, with_upstream

if TYPE_CHECKING:
    from components.evaluation.promotion import Decision

# the nightly refresh: fresh real data, buffer, annotation, experience model and fidelity
NIGHTLY_FAMILIES = ("data", "experience")
FIDELITY_STAGE = "evaluate_fidelity"  # writes the held-out metric the promotion rule reads
TABLE1_STAGE = "table1"  # held-out success per method: picks policy@champion


def _run(name: str, root: str, stages: list[str], force: bool) -> list[str]:
    root_path = Path(root).resolve()
    known = stage_order(root_path)
    unknown = sorted(set(stages) - set(known))
    if unknown:
        raise ValueError(f"unknown stages {unknown}; dvc.yaml has {known}")
    if not force:  # forced: only those stages (dvc repro --single-item)
        stages = with_upstream(root_path, stages)
    with pipeline_run(root_path, name, {"stages": stages, "force": force}) as run_id:
        run_stages(stages, root_path, run_id, force)
    return stages


@flow(name="pipeline", log_prints=True)
def pipeline(
    root: str = ".", stages: list[str] | None = None, force: bool = False, promote: bool = True
) -> list[str]:
    """Run the given DVC stages (default: all) in order; returns the stages run.

    With ``promote``, a run that evaluated the experience model's fidelity applies the
    promotion rule to ``experience-model@candidate`` afterwards, and a run that built
    Table 1 chooses ``policy@champion`` from it.
    """
    ran = _run("pipeline", root, stages or stage_order(Path(root).resolve()), force)
    if promote and FIDELITY_STAGE in ran:
        promote_experience_model(Path(root).resolve())
    if promote and TABLE1_STAGE in ran:
        promote_policy(Path(root).resolve())
    return ran


@flow(name="data")
def data_flow(root: str = ".", force: bool = False) -> list[str]:
    """Tasks, real collection, ingestion, buffer and teacher annotation."""
    return _run("data", root, family_stages(Path(root).resolve(), "data"), force)


@flow(name="experience")
def experience_flow(root: str = ".", force: bool = False) -> list[str]:
    """SFT of the experience model (and its ablation variants) and its fidelity."""
    return _run("experience", root, family_stages(Path(root).resolve(), "experience"), force)


@flow(name="agent")
def agent_flow(root: str = ".", force: bool = False) -> list[str]:
    """Baselines, real-env RL, DreamGym RL, sim-to-real and held-out evaluation."""
    return _run("agent", root, family_stages(Path(root).resolve(), "agent"), force)


@flow(name="evaluation")
def evaluation_flow(root: str = ".", force: bool = False) -> list[str]:
    """Table 1, the LLM judge, drift reports and the run report."""
    return _run("evaluation", root, family_stages(Path(root).resolve(), "evaluation"), force)


@flow(name="nightly-refresh", log_prints=True)
def nightly_refresh(root: str = ".", fresh: bool = True) -> dict[str, object]:
    """Fresh data -> buffer -> experience model -> fidelity -> promote if better.

    ``fresh`` bumps ``collect.round`` in params.yaml first, so DVC collects new real
    episodes (same tasks, new seeds) and reruns everything downstream of them; commit the
    params.yaml + dvc.lock change to keep the refreshed data version. A night that failed
    leaves its round unfinished: the next one resumes it instead of bumping again (a bump
    would drop the episodes it had collected).
    """
    root_path = Path(root).resolve()
    stages = [s for family in NIGHTLY_FAMILIES for s in family_stages(root_path, family)]
    collect_round = night_round(root_path) if fresh else None
    if collect_round is not None:
        get_run_logger().info("collecting fresh real episodes: collect.round = %d", collect_round)
    _run("nightly-refresh", root, stages, force=False)
    if collect_round is not None:
        _write_night(root_path, collect_round, completed=True)
    decision = promote_experience_model(root_path)
    return {
        "stages": stages,
        "collect_round": collect_round,
        "promoted": decision.promote,
        "reason": decision.reason,
    }


NIGHT_STATE = "data/.nightly-round.json"  # the round the last fresh night started, and if it ended


def night_round(root: Path) -> int:
    """The ``collect.round`` tonight collects: the last night's if it never completed
    (resumed), else a new one (bumped). params.yaml is validated before it is touched."""
    import json

    current = load_config(root / PARAMS_FILE).collect.round
    try:
        last = json.loads((root / NIGHT_STATE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        last = {}
    if isinstance(last, dict) and last.get("round") == current and not last.get("completed"):
        return current
    new = bump_collect_round(root)
    _write_night(root, new, completed=False)
    return new


def _write_night(root: Path, collect_round: int, *, completed: bool) -> None:
    """Record the night's round and whether its stages all ran."""
    import json

    from components.io import atomic_write_text

    path = root / NIGHT_STATE
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps({"round": collect_round, "completed": completed}) + "\n")


def bump_collect_round(root: Path) -> int:
    """Increment ``collect.round`` in params.yaml (comments kept); returns the new round."""
    from ruamel.yaml import YAML

    yaml = YAML()  # round-trip mode: the file keeps its comments and layout
    path = root / PARAMS_FILE
    params = yaml.load(path.read_text(encoding="utf-8"))
    new = int(params["collect"].get("round", 0)) + 1
    params["collect"]["round"] = new
    with path.open("w", encoding="utf-8") as f:
        yaml.dump(params, f)
    return new


def promote_experience_model(root: Path) -> Decision:
    """Apply the promotion rule to ``experience-model@candidate`` (after its fidelity)."""
    from components.config import Paths, load_config
    from components.stages import promote

    decision = promote.promote_experience_model(load_config(root / PARAMS_FILE), Paths(root))
    get_run_logger().info("promotion of the experience model: %s", decision)
    return decision


def promote_policy(root: Path) -> Decision:
    """``policy@champion``: Table 1's best held-out success, if above random and the champion."""
    from components.config import Paths, load_config
    from components.stages import promote

    decision = promote.promote_policy(load_config(root / PARAMS_FILE), Paths(root))
    get_run_logger().info("promotion of the policy: %s", decision)
    return decision


def main(argv: list[str] | None = None) -> list[str]:
    """``python -m flows.pipeline [--stage S ...] [--force] [--no-promote] [--root R]``

    The ``pipeline`` flow in this process (ephemeral Prefect server unless
    ``PREFECT_API_URL`` is set). A missing dvc.yaml, an unknown stage or an invalid
    params.yaml ends it with one ``error:`` line and exit code 2 before any Prefect run
    (flows/cli.py)."""
    parser = argparse.ArgumentParser(
        prog="python -m flows.pipeline",
        description="Run the DVC stages (default: all) in dependency order as Prefect tasks, "
        "under one MLflow parent run; then the promotion rules.",
    )
    parser.add_argument("--root", default=".", help="project root (default: .)")
    parser.add_argument(
        "--stage",
        action="append",
        help="a dvc.yaml stage (repeatable; default: all); the stale stages upstream of it "
        "run first",
    )
    parser.add_argument(
        "--force", action="store_true", help="rerun only the given stages, even if fresh"
    )
    parser.add_argument("--no-promote", action="store_true", help="skip the promotion rules")
    args = parser.parse_args(argv)
    root = Path(args.root).resolve()
    with one_line_errors():
        if not (root / DVC_FILE).is_file():
            where = root / DVC_FILE
            raise ConfigError(f"{where} not found (run from the project root or pass --root)")
        known = stage_order(root)
        unknown = sorted(set(args.stage or ()) - set(known))
        if unknown:
            raise ConfigError(f"unknown stages {unknown}; dvc.yaml has {known}")
        # a bad params.yaml fails here in one line, not in the first stage of a started
        # Prefect server and MLflow run (flows/envs.py does the same)
        load_config(root / PARAMS_FILE)
        return pipeline(
            root=str(root), stages=args.stage, force=args.force, promote=not args.no_promote
        )


if __name__ == "__main__":
    main()
