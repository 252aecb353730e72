"""S2R's saved probes and walks are reused only by the run that made them: a rerun after
its DreamGym policy was retrained, or on other maps, spends its real steps anew."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from tests.agent.rl_env import counted, magic_grpo, magic_task, probe_tasks


def test_probes_of_another_policy_or_sampling_are_not_reused(magic_policy, tmp_path: Path):
    from components.stages.regrounding import probe_rollouts

    stepped: list[str] = []
    Counted = counted(stepped)
    tasks = probe_tasks()
    kw = {"cap": 6, "batch_size": 2, "seed": 0, "out_dir": tmp_path}
    cfg = magic_grpo()
    probe_rollouts(magic_policy, lambda: Counted(max_steps=3), tasks, cfg, **kw)
    assert len(stepped) == 6
    probe_rollouts(magic_policy, lambda: Counted(max_steps=3), tasks, cfg, **kw)
    assert len(stepped) == 6  # the same run resumed: reused
    hotter = cfg.model_copy(update={"temperature": cfg.temperature * 2})
    probe_rollouts(magic_policy, lambda: Counted(max_steps=3), tasks, hotter, **kw)
    assert len(stepped) == 12  # other sampling: probed anew
    with torch.no_grad():
        next(magic_policy.model.parameters()).add_(0.5)  # a retrained policy
    probe_rollouts(magic_policy, lambda: Counted(max_steps=3), tasks, cfg, **kw)
    assert len(stepped) == 18


def test_walks_on_other_maps_are_not_reused(tmp_path: Path):
    from components.stages.exploration import RoomMap, explore_rollouts

    task = magic_task(0)
    maps = {task.task_id: RoomMap(exits={"Hall": {"east", "west"}})}

    def no_env() -> Any:
        raise AssertionError("a real env was started")

    kw = {"cap": 0, "max_steps": 3, "seed": 0, "out_dir": tmp_path}
    assert explore_rollouts(maps, no_env, [task], **kw) == ([], 0)  # nothing left to spend
    saved = sorted(p.name for p in tmp_path.iterdir())
    other = {
        task.task_id: RoomMap(exits={"Hall": {"east", "west"}}, leads={("Hall", "east"): "Den"})
    }
    explore_rollouts(other, no_env, [task], **kw)
    assert len(sorted(p.name for p in tmp_path.iterdir())) == 2 * len(saved)  # a file of its own


def test_probe_success_counts_the_policys_probes_not_the_walks(monkeypatch, tmp_path: Path):
    import components.stages.exploration as exploration
    import components.stages.regrounding as regrounding
    from components.config import Paths, load_config
    from tests.factories import make_trajectory

    cfg = load_config(profile="ci")
    cfg = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"s2r_explore": True})})
    probes = [make_trajectory(2, success=s, idx=i) for i, s in enumerate((True, False))]
    walks = [make_trajectory(3, success=False, idx=10 + i, policy="walk") for i in range(2)]
    monkeypatch.setattr(regrounding, "probe_rollouts", lambda *a, **kw: (probes, 4))
    monkeypatch.setattr(regrounding, "offline_train", lambda paths: [])
    monkeypatch.setattr(exploration, "explore_rollouts", lambda *a, **kw: (walks, 6))
    monkeypatch.setattr(regrounding, "regrounded_model", lambda *a: None)
    real, _, figures = regrounding.reground(
        cfg, Paths(tmp_path), None, [], magic_grpo(), cap=10, seed=0, out_dir=tmp_path
    )
    assert real == [*probes, *walks]  # the refit sees every real episode
    assert figures["probe_success"] == 0.5  # one of the policy's two probes won
    assert figures["probe_real_steps"] == 10 and figures["explore_walks"] == 2
