"""``dreamgym archive-env``: another checkout's run of one env into this project
(components/evaluation/env_archive.py).

Registered on the ``dreamgym`` app by components/cli.py.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer


def archive_env_command(
    source: Annotated[
        Path,
        typer.Argument(
            help="the checkout whose run to archive (e.g. a clone after "
            "`dvc exp run -S env.name=miniwob`, or a flows/envs.py workspace)"
        ),
    ],
    root: Annotated[Path, typer.Option(help="this project's root")] = Path("."),
    env: Annotated[
        str | None,
        typer.Option(help="the env to take (default: the one SOURCE's Table 1 was made for)"),
    ] = None,
    note: Annotated[
        str | None,
        typer.Option(help="free text kept in archive.json (machine, command, wall time)"),
    ] = None,
) -> None:
    """Archive SOURCE's run of one env here: its metrics, report and figures replace
    reports/envs/<env>/ (with archive.json: source, provenance, files), and its rows go into
    metrics/table1.json and metrics/policy_fidelity.json beside the other envs' (each with
    its run's provenance under _provenance_by_env); both .md files are rewritten."""
    from components.cli_process import EXIT_ERROR, _one_line
    from components.evaluation.env_archive import archive_env

    if not root.is_dir():  # a typo would get a new project (metrics/, reports/) there
        typer.echo(f"error: --root {root}: no such folder (the project root)", err=True)
        raise typer.Exit(EXIT_ERROR)
    try:
        done = archive_env(source, root, env=env, note=note)
    except (OSError, ValueError) as err:  # no run there, a broken file, a read-only root
        typer.echo(f"error: {_one_line(str(err))}", err=True)
        raise typer.Exit(EXIT_ERROR) from None
    prov = done.provenance
    commit = str(prov.get("git_commit") or "unknown")[:8]
    dirty = " (dirty tree)" if prov.get("dirty") else ""
    typer.echo(
        f"{done.env}: run of {commit}{dirty}, profile {prov.get('profile')}: "
        f"{len(done.copied)} files -> {done.folder}"
    )
    typer.echo(f"merged into: {', '.join(done.merged) or 'nothing (no entries for this env)'}")
    if done.missing:
        typer.echo(f"not in the source (a partial run?): {', '.join(done.missing)}", err=True)
