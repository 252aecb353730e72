"""Real TextWorld games for the integration tests, generated once per session (~10 s)."""

from __future__ import annotations

import pytest

from tests.integration.textworld_suite import Suite, suite_config


@pytest.fixture(scope="session")
def tw_suite(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    """The generated suite of ``suite_config()`` under a temporary project root."""
    from components.envs.textworld_tasks import generate_task_suite

    root = tmp_path_factory.mktemp("twroot")
    cfg = suite_config()
    tasks = generate_task_suite(cfg, root / "data" / "tasks", progress=False, root=root)
    return Suite(cfg=cfg, root=root, tasks=tasks)
