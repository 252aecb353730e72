"""GRPO and PPO rounds on REAL TextWorld games: turns, invalid path, exact real-step counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.agent.policy import PolicySettings
from components.agent.policy_base import MALFORMED_ACTION
from components.agent.policy_model import PolicyModel
from components.agent.rollout import collect_rollouts
from components.agent.train import train_rl
from components.envs.textworld_env import TextWorldEnv
from components.envs.vector import EnvList
from tests.factories import each_rl_algo
from tests.integration.textworld_suite import Suite, games_pool, generate_shared, suite_config

pytestmark = pytest.mark.integration
MAX_STEPS = 3


@pytest.fixture(scope="module")
def quest_suite(tmp_path_factory: pytest.TempPathFactory) -> Suite:
    """Two small real quest games under a temporary project root."""
    from components.config import TaskFamilyConfig

    base = suite_config()
    families = (TaskFamilyConfig(name="quest", n_games=2, min_difficulty=1, max_difficulty=1),)
    cfg = base.model_copy(update={"tasks": base.tasks.model_copy(update={"families": families})})
    root = tmp_path_factory.mktemp("rl-tw")
    tasks = generate_shared(cfg, root, games_pool(tmp_path_factory))
    return Suite(cfg=cfg, root=root, tasks=tasks)


class CountingTextWorld(TextWorldEnv):
    """The real env, counting the steps it is really asked to take."""

    def __init__(self, root: Path) -> None:
        super().__init__(max_steps=MAX_STEPS, root=root)
        self.calls = 0

    def step(self, action: str):  # type: ignore[override]
        """Count, then step the real game."""
        self.calls += 1
        return super().step(action)


def test_malformed_answers_are_invalid_real_steps(
    magic_policy: PolicyModel, quest_suite: Suite
) -> None:
    strict = PolicyModel(magic_policy.model, magic_policy.tokenizer, PolicySettings())
    envs = [CountingTextWorld(quest_suite.root) for _ in range(2)]
    venv = EnvList(envs)
    try:
        batch = collect_rollouts(strict, venv, quest_suite.tasks[:1] * 2, max_new_tokens=8)
    finally:
        venv.close()
    turns = [t for e in batch.episodes for t in e.turns]
    assert len(turns) == 2 * MAX_STEPS  # never won: truncated by the env's step limit
    assert all(e.truncated and not e.success for e in batch.episodes)
    assert {t.act.action for t in turns} == {MALFORMED_ACTION}
    assert not any(t.valid for t in turns)  # the real game rejected "noop"
    assert batch.real_steps == venv.real_steps == sum(e.calls for e in envs) == len(turns)
    # the real game's answer is what the next prompt shows (observation, never trained on)
    first = batch.episodes[0].turns
    assert first[1].observation.state == first[0].next_state
    assert first[0].observation.admissible  # TextWorld lists admissible commands


@each_rl_algo(iterations=2, tasks_per_iteration=2, rollouts_per_task=2, max_new_tokens=8)
def test_training_rounds_on_real_textworld_count_every_step(
    magic_policy: PolicyModel, quest_suite: Suite, cfg, tmp_path: Path
) -> None:
    made: list[CountingTextWorld] = []

    def factory() -> CountingTextWorld:
        made.append(CountingTextWorld(quest_suite.root))
        return made[-1]

    history: list[dict] = []
    out = train_rl(
        magic_policy,
        factory,
        quest_suite.tasks,
        cfg,
        tmp_path,
        log_fn=lambda m, step: history.append(m),
    )
    assert out["iterations"] == 2 and len(history) == 2
    assert out["real_steps"] == sum(e.calls for e in made) == history[-1]["real_steps"]
    assert history[0]["real_steps_round"] + history[1]["real_steps_round"] == out["real_steps"]
    assert out["real_steps"] <= 2 * 4 * MAX_STEPS and out["episodes"] == 8
    assert (tmp_path / "history.jsonl").read_text().count("\n") == 2
