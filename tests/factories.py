"""Small builders of valid records for tests (real schema, no mocks)."""

from __future__ import annotations

from typing import Any

from components.episodes import task_trajectory, task_transition
from components.schema import Provenance, Task, Trajectory, Transition, stable_id


def make_task(
    task_id: str = "tw-quest-0",
    instruction: str = "Find the key and open the chest.",
    seed: int = 0,
    **fields: Any,
) -> Task:
    """A train-split difficulty-1 TextWorld quest task; ``fields`` override the rest."""
    base: dict[str, Any] = {"env": "textworld", "family": "quest", "difficulty": 1}
    return Task(
        task_id=task_id,
        instruction=instruction,
        seed=seed,
        **{**base, "split": "train", **fields},
    )


def make_step(
    episode_id: str,
    step_index: int,
    state: str,
    action: str,
    next_state: str,
    *,
    task_id: str = "tw-quest-0",
    instruction: str = "Find the key and open the chest.",
    policy: str = "expert",
    **fields: Any,
) -> Transition:
    """One valid real TextWorld transition of ``episode_id``; ``fields`` override the rest.

    Unless ``fields`` name them: no reward, not done, valid, no admissible actions, and an
    iteration-0 ``policy`` provenance (``seed=`` goes into it).
    """
    task = make_task(task_id, instruction, env=fields.pop("env", "textworld"))
    seed = fields.pop("seed", None)
    base: dict[str, Any] = {
        "reward": 0,
        "done": False,
        "admissible_actions": None,
        "valid_action": True,
        "source": "real",
        "provenance": Provenance(policy=policy, seed=seed),
    }
    return task_transition(
        task, episode_id, step_index, state, action, next_state, **{**base, **fields}
    )


def trajectory_of(
    steps: list[Transition],
    split: str = "train",
    initial_state: str | None = None,
    truncated: bool = False,
) -> Trajectory:
    """The trajectory of ``steps`` (one episode): its ids, source and policy come from them.

    It starts at the first step's state unless ``initial_state`` is given, and succeeds
    when the last step is rewarded.
    """
    first = steps[0]
    task = make_task(first.task_id, first.instruction, env=first.env, split=split)
    start = first.state if initial_state is None else initial_state
    return task_trajectory(task, steps, start, truncated)


def make_trajectory(
    n_steps: int = 3,
    success: bool = True,
    task_id: str = "tw-quest-0",
    policy: str = "expert",
    idx: int = 0,
    split: str = "train",
) -> Trajectory:
    """A consistent trajectory of ``n_steps`` TextWorld-like steps."""
    episode_id = stable_id(task_id, policy, idx)
    states = [
        f"Location: Room {i}\nA plain room.\nInventory: nothing\nFeedback: ok"
        for i in range(n_steps + 1)
    ]
    steps = [
        make_step(
            episode_id,
            i,
            states[i],
            f"go east {i}",
            states[i + 1],
            task_id=task_id,
            policy=policy,
            seed=idx,
            reward=int(success and i == n_steps - 1),
            done=i == n_steps - 1,
            admissible_actions=["go east", "look"],
        )
        for i in range(n_steps)
    ]
    return trajectory_of(steps, split)


def fast_client(config_cls: Any, key_env: str, **settings: Any) -> Any:
    """An API client config (teacher, judge) with test-sized retries: 2, backing off
    10-50 ms; its key read from ``key_env``; ``settings`` override the rest."""
    fast = {"max_retries": 2, "backoff_base_s": 0.01, "backoff_max_s": 0.05}
    return config_cls(**{"api_key_env": key_env, **fast, **settings})


def chain_lm(tok: Any) -> Any:
    """A deterministic model: the next token is a fixed function of the last one.

    One Llama layer with zeroed projections is an identity on the residual stream; with
    one-hot embeddings and a permutation-like head, greedy decoding follows
    <state> x </state> <reward> 0 </reward> y y y ... (never eos), and "z" -> eos.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    vocab = len(tok)
    model = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=vocab,
            hidden_size=vocab,
            intermediate_size=8,
            num_hidden_layers=1,
            num_attention_heads=1,
            num_key_value_heads=1,
            tie_word_embeddings=False,
            pad_token_id=tok.pad_token_id,
            eos_token_id=tok.eos_token_id,
        )
    )
    tag = {
        t: tok.convert_tokens_to_ids(t) for t in ("<state>", "</state>", "<reward>", "</reward>")
    }
    x, zero, y, z = (tok(t, add_special_tokens=False)["input_ids"][0] for t in "x0yz")
    chain = {tag["<state>"]: x, x: tag["</state>"], tag["</state>"]: tag["<reward>"]}
    chain |= {tag["<reward>"]: zero, zero: tag["</reward>"], tag["</reward>"]: y}
    chain |= {z: tok.eos_token_id}
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.model.embed_tokens.weight.copy_(torch.eye(vocab))
        model.model.norm.weight.fill_(1.0)
        for t in range(vocab):
            model.lm_head.weight[chain.get(t, y), t] = 1.0
    return model.eval()


# RL settings the unit tests were written for: seconds-scale rounds (params.yaml's cpu
# values, the config classes' defaults, train for minutes)
SMALL_RL: dict[str, Any] = {
    "iterations": 10,
    "tasks_per_iteration": 4,
    "learning_rate": 1e-5,
    "epochs": 1,
    "minibatch_size": None,
    "micro_batch_size": 8,
    "max_new_tokens": 64,
    "save_every": 5,
}


def grpo_config(**overrides: Any) -> Any:
    """A small GRPOConfig: ``SMALL_RL`` under ``overrides``."""
    from components.config import GRPOConfig

    return GRPOConfig(**{**SMALL_RL, **overrides})


def ppo_config(**overrides: Any) -> Any:
    """A small PPOConfig: ``SMALL_RL`` with PPO's own small settings under ``overrides``."""
    from components.config import PPOConfig

    small = {**SMALL_RL, "epochs": 2, "minibatch_size": 16, "gamma": 1.0, "seeds": None}
    return PPOConfig(**{**small, **overrides})


def each_rl_algo(
    grpo: dict[str, Any] | None = None, ppo: dict[str, Any] | None = None, **shared: Any
) -> Any:
    """Parametrize a test's ``cfg`` by a GRPO and a PPO config (ids ``grpo``, ``ppo``): both
    small configs under ``shared``, each under its own ``grpo`` / ``ppo`` overrides."""
    import pytest

    configs = [grpo_config(**shared, **(grpo or {})), ppo_config(**shared, **(ppo or {}))]
    return pytest.mark.parametrize("cfg", configs, ids=["grpo", "ppo"])


def table1_row(success: float) -> dict[str, Any]:
    """One method's Table-1 row (4 games, 2 seeds)."""
    return {
        "success": success,
        "ci_low": success - 0.1,
        "ci_high": success + 0.1,
        "episodes": 8,
        "tasks": 4,
        "seeds": 2,
        "real_steps": None,
    }


def run_provenance(env: str, commit: str) -> dict[str, Any]:
    """A metrics file's ``_provenance`` of a clean ci run."""
    return {"env": env, "git_commit": commit, "dirty": False, "profile": "ci"}


# a project's table1.json (its own env textworld) and a clone's after a scienceworld run:
# fresh scienceworld rows beside stale copies of the others
TABLE1_PROJECT: dict[str, Any] = {
    "_headline": "sampled",
    "_provenance": run_provenance("textworld", "aaa"),
    "_provenance_by_env": {
        "textworld": run_provenance("textworld", "aaa"),
        "scienceworld": run_provenance("scienceworld", "old"),
    },
    "textworld": {"sft": table1_row(0.4), "dpo": None},
    "scienceworld": {"sft": table1_row(0.1), "dpo": table1_row(0.2)},
}
TABLE1_CLONE: dict[str, Any] = {
    "_headline": "sampled",
    "_provenance": run_provenance("scienceworld", "new"),
    "_provenance_by_env": {"scienceworld": run_provenance("scienceworld", "new")},
    "scienceworld": {"sft": table1_row(0.3), "dpo": None},
    "textworld": {"sft": table1_row(0.9), "dpo": table1_row(0.9)},  # stale
    "miniwob": {"sft": table1_row(0.5)},
}
