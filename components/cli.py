"""``dreamgym``: one command per DVC stage (see dvc.yaml), plus config inspection.

Run from the project root, e.g. ``dreamgym collect``; DVC calls exactly these commands.
Nothing heavy is imported at start-up, so ``dreamgym --help`` answers instantly.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from components.config import PARAMS_FILE, Config, Paths, load_config

app = typer.Typer(
    name="dreamgym",
    help=(
        "Train LLM agents with RL in a synthetic environment (DreamGym). Each command is "
        "one stage of the DVC pipeline (`dvc repro` runs them in order); params come from "
        "params.yaml and its active profile."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ParamsOpt = Annotated[Path, typer.Option("--params", help="params file with sections and profiles")]
ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", help="override the profile named in params.yaml (ci, cpu, gpu)"),
]
RootOpt = Annotated[Path, typer.Option("--root", help="project root (data/, mlflow.db ...)")]

# offline, quiet defaults for every library the stages use
_QUIET_ENV = {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DO_NOT_TRACK": "1",
    "GX_ANALYTICS_ENABLED": "false",
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "TOKENIZERS_PARALLELISM": "false",
}


# Exit codes of the known failures (anything else is a bug and keeps its traceback).
EXIT_ERROR, EXIT_CONFIG, EXIT_BUDGET, EXIT_BUSY = 1, 2, 3, 75  # 75: EX_TEMPFAIL, retry later
# filesystem errors a user can fix (disk full, permissions, read-only, a folder for a file)
_FS_ERRNOS = {
    errno.ENOSPC: "free some disk space, then rerun",
    errno.EDQUOT: "free some space (disk quota exceeded), then rerun",
    errno.EFBIG: "the file is too large for this filesystem",
    errno.EACCES: "check the permissions of that path",
    errno.EPERM: "check the permissions of that path",
    errno.EROFS: "the filesystem is read-only: use a writable --root",
    errno.EISDIR: "a folder is in the way of a file",
    errno.ENOTDIR: "a file is in the way of a folder",
}


def _one_line(text: str) -> str:
    return "; ".join(part.strip() for part in str(text).splitlines() if part.strip())


def _known_error(err: BaseException) -> tuple[int, str] | None:
    """(exit code, one-line message) of a failure the user can act on, else None."""
    from components.config import ConfigError
    from components.io import InputError, OutputBusyError, OutputWriteError

    # classes of modules not imported yet cannot be what was raised: no import for them
    mods = sys.modules
    teacher, annotate = mods.get("components.teacher.base"), mods.get("components.teacher.annotate")
    buffer = mods.get("components.buffer.store")
    rl = mods.get("components.stages.rl")
    if rl and isinstance(err, rl.NoUpdateError):
        return EXIT_ERROR, str(err)
    if isinstance(err, ConfigError):
        return EXIT_CONFIG, str(err)
    if isinstance(err, OutputBusyError):
        return EXIT_BUSY, str(err)
    if teacher and isinstance(err, teacher.BudgetExhaustedError):
        return EXIT_BUDGET, f"{err}; rerun to resume. stats: {json.dumps(err.stats)}"
    if (teacher and isinstance(err, teacher.TeacherError)) or (
        annotate and isinstance(err, annotate.AnnotationFileError)
    ):
        return EXIT_ERROR, str(err)
    if buffer and isinstance(err, buffer.ReplayBufferError):
        return EXIT_ERROR, str(err)
    if isinstance(err, InputError | FileNotFoundError) and err.args:
        return EXIT_ERROR, str(err)  # FileNotFoundError: the stages' "run X first" hints
    if isinstance(err, OutputWriteError) or (isinstance(err, OSError) and err.errno in _FS_ERRNOS):
        hint = _FS_ERRNOS.get(err.errno or 0)
        what = err.strerror or str(err)
        where = f"{err.filename}: " if err.filename else ""
        message = f"{where}{what}" + (f" ({hint})" if hint else "")
        if isinstance(err, OutputWriteError):
            message += "; the previous outputs are unchanged"
        return EXIT_ERROR, message
    return None


@contextmanager
def _errors() -> Iterator[None]:
    """Known failures end the command with one line on stderr and their exit code."""
    try:
        yield
    except typer.Exit:
        raise
    except Exception as err:
        known = _known_error(err)
        if known is None:
            raise
        code, message = known
        typer.echo(f"error: {_one_line(message)}", err=True)
        raise typer.Exit(code) from None


def _setup(params: Path, profile: str | None, root: Path) -> tuple[Config, Paths]:
    for key, value in _QUIET_ENV.items():
        os.environ.setdefault(key, value)
    logging.basicConfig(
        level=logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        datefmt="%H:%M:%S",
    )
    with _errors():
        cfg = load_config(params, profile)
    return cfg, Paths(root.resolve())


def _run(stage: Callable[[Config, Paths], dict[str, Any]], params, profile, root) -> None:
    cfg, paths = _setup(params, profile, root)
    with _errors():
        summary = stage(cfg, paths)
    typer.echo(json.dumps(summary, indent=2, sort_keys=True, default=str))


@app.command("generate-tasks")
def generate_tasks(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Generate the TextWorld task suite (games + train/validation/test split by game)."""
    from components.stages import data as stages

    _run(stages.generate_tasks, params, profile, root)


@app.command("collect")
def collect(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Collect real trajectories (expert / noisy / random); resumable after interruption."""
    from components.stages import data as stages

    _run(stages.collect, params, profile, root)


@app.command("ingest")
def ingest(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Validate raw trajectories with Great Expectations; quarantine bad rows with reasons."""
    from components.stages import data as stages

    _run(stages.ingest, params, profile, root)


@app.command("build-buffer")
def build_buffer(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Build the seed replay buffer (LanceDB) from real train-split transitions."""
    from components.stages import buffer as stages

    _run(stages.build_buffer, params, profile, root)


@app.command("annotate")
def annotate(
    params: ParamsOpt = Path(PARAMS_FILE),
    profile: ProfileOpt = None,
    root: RootOpt = Path("."),
    fresh: Annotated[
        bool, typer.Option("--fresh", help="discard existing annotations instead of resuming")
    ] = False,
) -> None:
    """Annotate every real transition with a teacher reasoning trace (resumable)."""
    from components.stages import data as stages

    _run(lambda cfg, paths: stages.annotate(cfg, paths, fresh=fresh), params, profile, root)


@app.command("train-experience-model")
def train_experience_model(
    variant: Annotated[
        str,
        typer.Option(
            help="full: the pipeline's model (registered as experience-model@candidate); "
            "no_reasoning / no_history / no_replay: one ablation on, for the fidelity table"
        ),
    ] = "full",
    params: ParamsOpt = Path(PARAMS_FILE),
    profile: ProfileOpt = None,
    root: RootOpt = Path("."),
) -> None:
    """SFT of the reasoning experience model (resumable after an interruption)."""
    from functools import partial

    from components.stages import experience as stages

    if variant not in stages.VARIANTS:
        raise typer.BadParameter(f"{variant!r} is not one of {', '.join(stages.VARIANTS)}")
    _run(partial(stages.train_experience_model, variant=variant), params, profile, root)


@app.command("evaluate-fidelity")
def evaluate_fidelity(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Fidelity of every trained variant on validation transitions (+ open-loop rollouts)."""
    from components.stages import experience as stages

    _run(stages.evaluate_fidelity, params, profile, root)


AlgoOpt = Annotated[str, typer.Option("--algo", help="RL algorithm: grpo or ppo")]


def _algo(algo: str) -> str:
    from components.stages.rl import ALGOS

    if algo not in ALGOS:
        raise typer.BadParameter(f"{algo!r} is not one of {', '.join(ALGOS)}", param_hint="--algo")
    return algo


@app.command("train-sft")
def train_sft(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """SFT baseline: clone successful train-split trajectories -> models/policy/sft."""
    from components.stages import agent as stages

    _run(stages.train_sft_baseline, params, profile, root)


@app.command("train-dpo")
def train_dpo(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """DPO baseline from the SFT policy on offline preference pairs -> models/policy/dpo."""
    from components.stages import agent as stages

    _run(stages.train_dpo_baseline, params, profile, root)


@app.command("train-rl-real")
def train_rl_real(
    algo: AlgoOpt = "grpo",
    params: ParamsOpt = Path(PARAMS_FILE),
    profile: ProfileOpt = None,
    root: RootOpt = Path("."),
) -> None:
    """RL (GRPO/PPO) from the SFT policy in the real env -> models/policy/<algo>_real."""
    from functools import partial

    from components.stages import rl as stages

    _run(partial(stages.train_rl_real, algo=_algo(algo)), params, profile, root)


@app.command("train-dreamgym")
def train_dreamgym(
    algo: AlgoOpt = "grpo",
    params: ParamsOpt = Path(PARAMS_FILE),
    profile: ProfileOpt = None,
    root: RootOpt = Path("."),
) -> None:
    """DreamGym: RL in the synthetic env only (0 real steps) -> models/policy/dreamgym_<algo>."""
    from functools import partial

    from components.stages import rl as stages

    _run(partial(stages.train_dreamgym, algo=_algo(algo)), params, profile, root)


@app.command("train-s2r")
def train_s2r(
    algo: AlgoOpt = "grpo",
    params: ParamsOpt = Path(PARAMS_FILE),
    profile: ProfileOpt = None,
    root: RootOpt = Path("."),
) -> None:
    """Sim-to-real: DreamGym policy in the real env, real steps capped -> s2r_<algo>."""
    from functools import partial

    from components.stages import rl as stages

    _run(partial(stages.train_s2r, algo=_algo(algo)), params, profile, root)


@app.command("evaluate-policy")
def evaluate_policy(
    method: Annotated[
        str,
        typer.Argument(
            help="random (the random-admissible baseline), sft, dpo, grpo_real, ppo_real, "
            "dreamgym_grpo, dreamgym_ppo, s2r_grpo, s2r_ppo"
        ),
    ],
    params: ParamsOpt = Path(PARAMS_FILE),
    profile: ProfileOpt = None,
    root: RootOpt = Path("."),
) -> None:
    """Every seed of models/policy/METHOD on the held-out test tasks, sampled and greedy ->
    data/eval/METHOD.jsonl (episodes) and metrics/eval/METHOD.json."""
    from functools import partial

    from components.agent.table1 import METHODS
    from components.stages import agent as stages

    if method not in METHODS:
        raise typer.BadParameter(f"{method!r} is not one of {', '.join(METHODS)}")
    _run(partial(stages.evaluate_policy, method=method), params, profile, root)


@app.command("evaluate-random")
def evaluate_random(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """The random-admissible baseline on the held-out test tasks (same seeds, same step
    limit as every method) -> data/eval/random.jsonl and metrics/eval/random.json."""
    from functools import partial

    from components.stages import agent as stages

    _run(partial(stages.evaluate_policy, method=stages.RANDOM), params, profile, root)


@app.command("table1")
def table1(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Table 1 (success and real steps per method) -> metrics/table1.json and table1.md."""
    from components.stages import agent as stages

    _run(stages.build_table1, params, profile, root)


@app.command("config")
def show_config(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Print the resolved configuration of the active profile (validates params.yaml)."""
    cfg, _ = _setup(params, profile, root)
    typer.echo(json.dumps(cfg.model_dump(mode="json"), indent=2))


def main() -> None:
    """Console entry point."""
    app()


@app.command("judge")
def judge(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """LLM judge (consistency, diversity, informativeness, hallucination) per model variant."""
    from components.stages import evaluation as stages

    _run(stages.judge, params, profile, root)


@app.command("drift")
def drift(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Evidently drift reports: real vs synthetic transitions per co-evolution iteration."""
    from components.stages import evaluation as stages

    _run(stages.drift, params, profile, root)


@app.command("theorem1")
def theorem1(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Theorem-1 terms per DreamGym round (gains, KL, eps_R, eps_P) -> metrics/theorem1.json."""
    from components.stages import theorem1 as stages

    _run(stages.theorem1, params, profile, root)


@app.command("report")
def report(
    params: ParamsOpt = Path(PARAMS_FILE), profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Write reports/report.md and its plots from the metrics files; log them to MLflow."""
    from components.stages import evaluation as stages

    _run(stages.report, params, profile, root)


if __name__ == "__main__":
    sys.exit(main())
