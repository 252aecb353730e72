"""A child process for the RL crash test: ``train_rl`` on a tiny policy and real TextWorld.

``python -m tests.reliability.rl_trainer ROOT OUT LEDGER ALGO POLICY PAUSE_S`` trains for 6
rounds (GRPO or PPO) a ``scorer`` (the cpu profile's policy) or a tiny ``lm`` policy (the
gpu profile's kind), checkpointing every round, and books every real env step to LEDGER as
``<pid> <round>`` lines (an account of the steps independent of the trainer's counter).
It prints ``ROUND <n> <real steps>`` after each round and ``SUMMARY <json>`` at the end.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

ROUNDS = 6


def main(argv: list[str]) -> None:
    """Train as the test asks (root, out dir, ledger, algorithm, policy, pause per round)."""
    import torch

    from components.agent.scorer import ScorerPolicy, ScorerSettings
    from components.agent.train import train_rl
    from components.envs.textworld_env import TextWorldEnv
    from components.envs.textworld_tasks import load_task_suite
    from components.schema import Task
    from tests.factories import grpo_config, ppo_config

    torch.set_num_threads(1)  # deterministic and fair on a shared machine
    root, out, ledger = Path(argv[0]), Path(argv[1]), Path(argv[2])
    algo, kind, pause = argv[3], argv[4], float(argv[5])
    tasks = [t for t in load_task_suite(root / "data" / "tasks") if t.split == "train"]
    current = [0]

    def round_tasks(iteration: int) -> list[Task]:
        current[0] = iteration  # every env step below is booked to this round
        return [tasks[iteration % len(tasks)], tasks[(iteration + 1) % len(tasks)]]

    class LedgerTextWorld(TextWorldEnv):
        def step(self, action: str) -> Any:
            with ledger.open("a") as f:
                f.write(f"{os.getpid()} {current[0]}\n")
            return super().step(action)

    def log_round(metrics: dict[str, float], step: int) -> None:
        print(f"ROUND {step} {int(metrics['real_steps'])}", flush=True)
        time.sleep(pause)  # leaves the parent time to kill between rounds

    common: dict[str, Any] = {
        "iterations": ROUNDS,
        "tasks_per_iteration": 2,
        "max_new_tokens": 8,
        "save_every": 1,
        "keep_checkpoints": 2,
        "learning_rate": 1e-3,
    }
    cfg = (
        grpo_config(rollouts_per_task=2, drop_zero_std_groups=False, **common)
        if algo == "grpo"
        else ppo_config(minibatch_size=4, **common)
    )
    if kind == "scorer":  # no transformers to import: the child starts in a third the time
        policy: Any = ScorerPolicy(ScorerSettings(max_steps=3), seed=0)
    else:
        from components.agent.policy import PolicySettings
        from components.agent.policy_model import PolicyModel

        texts = [t.instruction for t in tasks] + ["<action>look</action> Location: Inventory:"]
        policy = PolicyModel.tiny(
            texts * 5, preset="nano", vocab_size=400, settings=PolicySettings(with_reasoning=False)
        )
    summary = train_rl(
        policy,
        lambda: LedgerTextWorld(max_steps=3, root=root),
        round_tasks,
        cfg,
        out,
        log_fn=log_round,
        fingerprint={"start": f"{kind}-0"},
    )
    print("SUMMARY " + json.dumps(summary), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
