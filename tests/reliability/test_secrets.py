"""Case 7, secrets: a sentinel API key never lands in logs, MLflow, data or reports.

The real ``dreamgym annotate`` CLI runs the openai teacher against the local fake server
with a sentinel key in the variable the teacher reads, inside a temp project tracked by
MLflow (SQLite + artifacts), with debug logging of the HTTP client on and faults that make
the teacher log retries and record failures. A second run hits a 401 whose body echoes
the Authorization header back. Then every file under the project root (mlflow.db,
mlruns/ artifacts, metrics, data, params) and both runs' stdout/stderr are scanned for
the key, its random part and its base64 form.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest

from tests.fakes import openai_server as fk
from tests.reliability.project import (
    KEY_ENV,
    child_env,
    cli_args,
    files_under,
    make_project,
    make_trajectories,
    openai_teacher,
    spawn,
    write_params,
)

pytestmark = [pytest.mark.integration, pytest.mark.timeout(240)]
SECRET_PART = "5f0c2b9e7d41a8836e1f"
SENTINEL = f"sk-SENTINEL-{SECRET_PART}"


def _needles() -> dict[str, bytes]:
    return {
        "key": SENTINEL.encode(),
        "random part": SECRET_PART.encode(),
        "base64": base64.b64encode(SENTINEL.encode())[:24],
    }


def _user_action(body: dict) -> str:
    return str((body.get("messages") or [{}])[-1].get("content", ""))


@pytest.mark.slow
def test_sentinel_key_appears_nowhere_after_a_tracked_run(tmp_path: Path, fake_openai) -> None:
    root = tmp_path / "project"
    trajs = make_trajectories(6, steps=4)

    def faults(index: int, body: dict) -> str:
        if "Action (a_t): go east 2" in _user_action(body):
            return fk.MALFORMED  # every attempt: a recorded failure with its raw excerpt
        return (fk.RATE_LIMIT, fk.SERVER_ERROR, fk.OK, fk.OK)[index % 4]

    srv = fake_openai(fault_fn=faults, api_key=SENTINEL, retry_after_s=0.05)
    _, paths = make_project(root, overrides=openai_teacher(srv.base_url))
    from components.schema import write_jsonl

    write_jsonl(paths.trajectories_file, trajs)
    env = child_env({KEY_ENV: SENTINEL, "OPENAI_LOG": "debug"})

    logs = [tmp_path / "annotate.log", tmp_path / "annotate-401.log"]
    proc = spawn(cli_args(root, "annotate"), env, logs[0])
    assert proc.wait(timeout=180) == 0, logs[0].read_text()[-3000:]
    text = logs[0].read_text()
    assert "retry" in text  # the faults were logged, so there was something to leak

    echo = fake_openai(faults=[fk.UNAUTHORIZED_ECHO], api_key=SENTINEL)
    write_params(root, openai_teacher(echo.base_url))
    proc = spawn(cli_args(root, "annotate", "--fresh"), env, logs[1])
    assert proc.wait(timeout=180) == 1  # a clear failure, not a traceback
    err = logs[1].read_text()
    assert "error: teacher request refused, HTTP 401" in err and "Bearer ***" in err

    # the key did travel, to the server only
    assert all(r.headers["authorization"] == f"Bearer {SENTINEL}" for r in srv.requests)
    scanned = [*files_under(root), *logs]
    assert paths.mlflow_db in scanned and any("mlruns" in p.parts for p in scanned)
    assert any(p.name == "annotations.failures.jsonl" for p in scanned)
    leaks = [
        f"{p} ({what})"
        for p in scanned
        for what, needle in _needles().items()
        if needle in p.read_bytes()
    ]
    assert not leaks, leaks
    mlflow_files = [p for p in scanned if "mlruns" in p.parts or p == paths.mlflow_db]
    print(
        f"\n[secrets] scanned {len(scanned)} files ({sum(p.stat().st_size for p in scanned)} "
        f"bytes; {len(mlflow_files)} MLflow files) + stdout/stderr of 2 runs: 0 occurrences"
    )
    summary = json.loads((root / "metrics" / "annotate.json").read_text())
    assert summary["n_failed"] > 0  # failures (with error text) were recorded and scanned
