"""``dreamgym``: one command per DVC stage (see dvc.yaml), plus config inspection.

Run from the project root, e.g. ``dreamgym collect``; DVC calls exactly these commands.
Nothing heavy is imported at start-up, so ``dreamgym --help`` answers instantly. Each stage
is one row of ``STAGES`` (components/cli_stages.py: name, stage function, help, extra
parameters); one generic callback loads the config, runs the stage and maps known failures
to exit codes.
"""

from __future__ import annotations

import importlib
import inspect
import json
import sys
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Annotated, Any

import typer

from components.cli_archive import archive_env_command
from components.cli_process import (  # noqa: F401  (EXIT_* and offline_and_quiet: public here too)
    EXIT_BUDGET,
    EXIT_BUSY,
    EXIT_CONFIG,
    EXIT_ERROR,
    DreamgymTyper,
    _errors,
    offline_and_quiet,
)
from components.cli_serve import serve
from components.cli_stages import STAGES, Param, Stage
from components.config import PARAMS_FILE, Config, ConfigError, Paths, load_config

app = DreamgymTyper(
    name="dreamgym",
    help=(
        "Train LLM agents with RL in a synthetic environment (DreamGym). Each command is "
        "one stage of the DVC pipeline (`dvc repro` runs them in order); params come from "
        "params.yaml and its active profile. CPU math runs on AVX2 kernels so results "
        "reproduce across hosts (DREAMGYM_CPU_KERNELS=native: this CPU's fastest)."
    ),
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)

ParamsOpt = Annotated[
    Path | None,
    typer.Option(
        "--params", help="params file with sections and profiles (default: <root>/params.yaml)"
    ),
]
ProfileOpt = Annotated[
    str | None,
    typer.Option("--profile", help="override the profile named in params.yaml (ci, cpu, gpu)"),
]
RootOpt = Annotated[Path, typer.Option("--root", help="project root (data/, mlflow.db ...)")]


def _setup(params: Path | None, profile: str | None, root: Path) -> tuple[Config, Paths]:
    with _errors():
        if not root.is_dir():  # a typo would get a new project (mlflow.db, data/) there
            raise ConfigError(f"--root {root}: no such folder (the project root)")
        offline_and_quiet()
        # --root alone: that project's own params, not the ones of the current folder
        cfg = load_config(root / PARAMS_FILE if params is None else params, profile)
    return cfg, Paths(root.resolve())


def _run(stage: Callable[[Config, Paths], dict[str, Any]], params, profile, root) -> None:
    cfg, paths = _setup(params, profile, root)
    with _errors():
        summary = stage(cfg, paths)
    typer.echo(json.dumps(summary, indent=2, sort_keys=True, default=str))


def _attr(ref: str) -> Any:
    """The object named by "module:name" (imported now)."""
    module, _, name = ref.partition(":")
    return getattr(importlib.import_module(module), name)


def _check(param: Param, value: Any) -> None:
    """A value outside ``param.choices`` is a usage error (exit 2), raised before any work."""
    if param.choices is None or value is None:  # None: the parameter's default meaning
        return
    allowed = _attr(param.choices)
    if value not in allowed:
        raise typer.BadParameter(
            f"{value!r} is not one of {', '.join(allowed)}", param_hint=param.hint
        )


_COMMON = (  # name, annotation, default of the options every stage takes
    ("params", ParamsOpt, None),
    ("profile", ProfileOpt, None),
    ("root", RootOpt, Path(".")),
)


def _command(stage: Stage) -> Callable[..., None]:
    """The typer callback of ``stage``: check its parameters, load the config, run it."""

    def command(**values: Any) -> None:
        run = _attr(f"components.stages.{stage.run}")
        for param in stage.params:
            _check(param, values[param.name])
        params, profile, root = (values.pop(name) for name, _, _ in _COMMON)
        _run(partial(run, **stage.fixed, **values), params, profile, root)

    def parameter(name: str, annotation: Any, default: Any) -> inspect.Parameter:
        kind = inspect.Parameter.KEYWORD_ONLY  # a required one may follow optional ones
        return inspect.Parameter(name, kind, default=default, annotation=annotation)

    first = [parameter(p.name, p.annotation, p.default) for p in stage.params if not p.last]
    last = [parameter(p.name, p.annotation, p.default) for p in stage.params if p.last]
    common = [parameter(*c) for c in _COMMON]
    # typer reads the command's parameters from its signature
    command.__signature__ = inspect.Signature([*first, *common, *last])  # type: ignore[attr-defined]
    command.__name__ = command.__qualname__ = stage.name.replace("-", "_")
    command.__doc__ = stage.help
    return command


for _stage in STAGES:
    app.command(_stage.name, help=_stage.help)(_command(_stage))


app.command("serve")(serve)  # components/cli_serve.py: models over the OpenAI protocol
app.command("archive-env")(archive_env_command)  # components/cli_archive.py


def _print_version(value: bool) -> None:
    if value:
        from importlib.metadata import PackageNotFoundError, version

        try:
            typer.echo(f"dreamgym {version('dreamgym')}")
        except PackageNotFoundError:  # run from a checkout that was never installed
            typer.echo("dreamgym (not installed: run `make setup`)")
        raise typer.Exit()


@app.callback()
def _options(
    show_version: Annotated[
        bool,
        typer.Option(
            "--version", help="Print the version and exit.", callback=_print_version, is_eager=True
        ),
    ] = False,
) -> None:
    """Options before the command."""


@app.command("config")
def show_config(
    params: ParamsOpt = None, profile: ProfileOpt = None, root: RootOpt = Path(".")
) -> None:
    """Print the resolved configuration of the active profile (validates params.yaml)."""
    cfg, _ = _setup(params, profile, root)
    typer.echo(json.dumps(cfg.model_dump(mode="json"), indent=2))


def main() -> None:
    """Console entry point."""
    app()


if __name__ == "__main__":
    sys.exit(main())
