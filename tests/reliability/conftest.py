"""Fixtures of the reliability suite: temp projects, the packaged embedder, ci configs."""

from __future__ import annotations

import pytest

from components.buffer.embedders import Embedder
from components.config import Config, load_config
from tests.integration.textworld_suite import Suite, games_pool, generate_shared, suite_config
from tests.reliability.project import ROOT


@pytest.fixture(scope="session")
def ci_config() -> Config:
    """The ci profile of the repository's params.yaml."""
    return load_config(ROOT / "params.yaml", profile="ci")


@pytest.fixture(scope="session")
def wordllama() -> Embedder:
    """The fast packaged embedder (loaded once per session)."""
    from components.buffer import WordLlamaEmbedder

    emb = WordLlamaEmbedder()
    emb.embed(["warm up"])
    return emb


@pytest.fixture(scope="session")
def tw_suite(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    """Three small real TextWorld games under a temporary project root (generated once)."""
    from components.config import TaskFamilyConfig

    base = suite_config()
    families = (TaskFamilyConfig(name="quest", n_games=3, min_difficulty=1, max_difficulty=2),)
    cfg = base.model_copy(
        update={
            "tasks": base.tasks.model_copy(update={"families": families}),
            "collect": base.collect.model_copy(
                update={
                    "episodes": {"expert": 1, "noisy": 3, "random": 6},
                    "splits": ("train", "validation", "test"),
                }
            ),
        }
    )
    root = tmp_path_factory.mktemp("twroot")
    tasks = generate_shared(cfg, root, games_pool(tmp_path_factory))
    return Suite(cfg=cfg, root=root, tasks=tasks)
