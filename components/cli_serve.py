"""``dreamgym serve``: saved models over the OpenAI protocol (components/lm/server.py).

Registered on the ``dreamgym`` app by components/cli.py; nothing heavy is imported until
the command runs.
"""

from __future__ import annotations

import contextlib
import os
from typing import Annotated

import typer

ModelOpt = Annotated[
    list[str],
    typer.Option(
        "--model",
        help="a saved model directory (served under that path, as `vllm serve DIR`), "
        "NAME=DIR, or a quoted glob such as 'models/policy/*/seed-*' (repeatable)",
    ),
]


def serve(
    model: ModelOpt,
    host: Annotated[str, typer.Option(help="address to bind")] = "127.0.0.1",
    port: Annotated[int, typer.Option(help="port to bind")] = 8000,
    api_key_env: Annotated[
        str | None,
        typer.Option(help="env var holding a key every request must send (unset: no key)"),
    ] = None,
    max_batch: Annotated[int, typer.Option(min=1, help="prompts decoded together")] = 16,
) -> None:
    """Serve saved models (policies, the experience model) over the OpenAI /v1/completions
    and /v1/chat/completions protocol with the project's batched Generator, until Ctrl-C.
    On a GPU host `vllm serve DIR` is the drop-in."""
    import logging

    from components.cli_process import _QUIET_ENV, EXIT_ERROR, _one_line

    for name, value in _QUIET_ENV.items():  # offline and quiet, as every stage
        os.environ.setdefault(name, value)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    from components.lm.server import CompletionServer, model_specs

    key = os.environ.get(api_key_env) if api_key_env else None
    if api_key_env and not key:
        typer.echo(f"error: {api_key_env} is not set", err=True)
        raise typer.Exit(EXIT_ERROR)
    try:
        models = model_specs(model)
        server = CompletionServer(models, host, port, api_key=key, max_batch=max_batch)
    except (OSError, ValueError) as err:  # no model there, port in use, bad model files
        typer.echo(f"error: {_one_line(str(err))}", err=True)
        raise typer.Exit(EXIT_ERROR) from None
    typer.echo(f"serving {', '.join(sorted(models))} at {server.base_url} (Ctrl-C stops)")
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C: stop serving, exit 0
        server.serve_forever()
