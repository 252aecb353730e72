"""Real TextWorld games for the integration tests, generated once per session (~10 s)."""

from __future__ import annotations

import pytest

from tests.integration.textworld_suite import Suite, games_pool, generate_shared, suite_config


@pytest.fixture(scope="session")
def tw_suite(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    """The generated suite of ``suite_config()`` under a temporary project root."""
    root = tmp_path_factory.mktemp("twroot")
    cfg = suite_config()
    tasks = generate_shared(cfg, root, games_pool(tmp_path_factory))
    return Suite(cfg=cfg, root=root, tasks=tasks)
