"""Shared fixtures of the agent tests (each helper only ADDS fixtures here)."""

from __future__ import annotations

import pytest

from components.lm.decoding import torch_threads

# --- RL (tests/agent/test_rl*.py) -------------------------------------------------------


@pytest.fixture
def one_thread():
    """Run torch on one thread: on a contended 2-core box two threads were ~80x slower."""
    with torch_threads(1):
        yield


@pytest.fixture(scope="session")
def magic_policy_state():
    """A tiny policy warm-started to answer ``<action>w</action>`` with w ~ uniform (~1 s)."""
    import torch

    from components.agent.policy import PolicySettings, render_answer
    from components.agent.policy_model import PolicyModel
    from tests.agent.rl_env import WORDS, corpus, first_observation

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        policy = PolicyModel.tiny(
            corpus(), preset="nano", vocab_size=400, settings=PolicySettings(with_reasoning=False)
        )
        prompt = policy.prompt_ids([first_observation()])[0]
        answers = [
            policy.tokenizer(render_answer(w, None), add_special_tokens=False)["input_ids"]
            for w in WORDS
        ]
        opt = torch.optim.Adam(policy.model.parameters(), lr=3e-3)
        for _ in range(60):
            loss = -policy.sequence_logprobs([prompt] * len(answers), answers).logprobs.sum(-1)
            opt.zero_grad()
            loss.mean().backward()
            opt.step()
    finally:
        torch.set_num_threads(before)
    state = {k: v.detach().clone() for k, v in policy.model.state_dict().items()}
    return policy, state


@pytest.fixture
def magic_policy(magic_policy_state, one_thread):
    """A fresh copy of the warm-started tiny policy (tests may train it)."""
    import copy

    from components.agent.policy_model import PolicyModel

    policy, state = magic_policy_state
    model = copy.deepcopy(policy.model)
    model.load_state_dict(state)
    return PolicyModel(model, policy.tokenizer, policy.settings)


# --- baselines and evaluation (tests/agent/test_baselines.py, test_evaluate.py) -----------

_HALL, _VAULT = "Hall", "Vault"
_BOX_INSTRUCTION = "Take the key and open the chest."


def _box_state(room: str, has_key: bool, feedback: str) -> str:
    things = "An exit leads east." if room == _HALL else "A chest. A key on the floor."
    if room == _VAULT and has_key:
        things = "A chest."
    inventory = "a key" if has_key else "nothing"
    return f"Location: {room}\n{things}\nInventory: {inventory}\nFeedback: {feedback}"


def _box_admissible(room: str, has_key: bool) -> list[str]:
    if room == _HALL:
        return ["go east", "look"]
    return sorted(["go west", "look", "open chest" if has_key else "take key"])


def box_trajectory(task_id: str, actions: list[str], policy: str, idx: int, split: str = "train"):
    """A recorded episode of a two-room "open the chest" game played with ``actions``."""
    from components.schema import stable_id
    from tests.factories import make_step, trajectory_of

    episode_id = stable_id(task_id, policy, idx, split)
    room, has_key, feedback = _HALL, False, "You are in the Hall."
    steps = []
    for i, action in enumerate(actions):
        state, admissible = _box_state(room, has_key, feedback), _box_admissible(room, has_key)
        valid, won = action in admissible, False
        if not valid:
            feedback = "That's not a verb I recognise."
        elif action == "go east":
            room, feedback = _VAULT, "You are in the Vault."
        elif action == "go west":
            room, feedback = _HALL, "You are in the Hall."
        elif action == "take key":
            has_key, feedback = True, "You take the key."
        elif action == "open chest":
            won, feedback = True, "You open the chest. You win!"
        else:
            feedback = "Nothing special."
        steps.append(
            make_step(
                episode_id,
                i,
                state,
                action,
                _box_state(room, has_key, feedback),
                task_id=task_id,
                instruction=_BOX_INSTRUCTION,
                policy=policy,
                seed=idx,
                reward=int(won),
                done=won or i == len(actions) - 1,
                admissible_actions=admissible,
                valid_action=valid,
            )
        )
        if won:
            break
    return trajectory_of(steps, split, truncated=not steps[-1].reward)


BOX_EXPERT = ["go east", "take key", "open chest"]


@pytest.fixture(scope="session")
def box_trajectories():
    """Offline episodes of the box game: successes, failures, and held-out splits."""
    return [
        box_trajectory("box-0", BOX_EXPERT, "expert", 0),
        # succeeds after a useless look and an invalid command
        box_trajectory("box-0", ["look", "sing", *BOX_EXPERT], "noisy", 1),
        # fails: wanders back west, then gives up
        box_trajectory("box-0", ["go east", "go west", "look", "look"], "noisy", 2),
        box_trajectory("box-0", ["sing", "go east", "look"], "random", 3),
        box_trajectory("box-1", ["go east", "look", "go west"], "random", 4),
        # never to be trained on
        box_trajectory("box-8", BOX_EXPERT, "expert", 5, split="validation"),
        box_trajectory("box-9", BOX_EXPERT, "expert", 6, split="test"),
    ]


@pytest.fixture(scope="session")
def agent_tw_suite(tmp_path_factory):
    """A generated tiny TextWorld suite (3 quests, 1 cooking, 1 treasure; ~10 s)."""
    from tests.integration.textworld_suite import Suite, games_pool, generate_shared, suite_config

    root = tmp_path_factory.mktemp("agent_tw")
    cfg = suite_config()
    tasks = generate_shared(cfg, root, games_pool(tmp_path_factory))
    return Suite(cfg=cfg, root=root, tasks=tasks)
