"""SFT and DPO baselines: their data (train split only, same-state pairs) and their training."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.agent.dpo_data import FAILED_CONTINUATION, INVALID, NO_PROGRESS, build_pairs
from components.agent.policy import PolicySettings, render_prompt
from components.agent.sft_data import PolicyExample, build_sft_examples, corpus, observation_at
from components.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SETTINGS = PolicySettings(history_len=2)


def _agent_cfg(**sft):
    acfg = load_config(ROOT / "params.yaml", profile="ci").agent
    return acfg.model_copy(update={"sft": acfg.sft.model_copy(update=sft)})


def test_sft_clones_only_valid_steps_of_successful_train_trajectories(box_trajectories):
    examples, stats = build_sft_examples(box_trajectories, SETTINGS)
    ok = {t.episode_id for t in box_trajectories if t.split == "train" and t.success}
    assert {ex.episode_id for ex in examples} == ok
    assert stats == {
        "trajectories": 2,
        "other_split": 2,
        "failed": 3,
        "other_policy": 0,
        "invalid_steps_skipped": 1,  # the noisy success's "sing"
        "steps": 3 + 4,
        "examples": 7,
    }
    assert all("sing" not in ex.answer for ex in examples)
    by_id = {(t.episode_id, i): (t, i) for t in box_trajectories for i in range(t.n_steps)}
    for ex in examples:  # the prompt is what the policy saw, the answer its recorded action
        traj, i = by_id[(ex.episode_id, ex.step_index)]
        assert list(ex.messages) == render_prompt(observation_at(traj, i, SETTINGS), SETTINGS)
        assert ex.answer.endswith(f"<action>{traj.steps[i].action}</action>")
    experts, _ = build_sft_examples(box_trajectories, SETTINGS, policies=["expert"])
    assert len(experts) == 3 and {ex.policy for ex in experts} == {"expert"}


def test_sft_never_reads_the_test_split(box_trajectories):
    with pytest.raises(ValueError, match="cannot feed training"):
        build_sft_examples(box_trajectories, SETTINGS, split="test")
    held_out, _ = build_sft_examples(box_trajectories, SETTINGS, split="validation")
    assert {ex.task_id for ex in held_out} == {"box-8"}


def test_dpo_pairs_share_the_state_and_differ_in_action(box_trajectories):
    pairs, stats = build_pairs(box_trajectories, SETTINGS)
    assert pairs and len({p.id for p in pairs}) == len(pairs)
    reasons = (INVALID, FAILED_CONTINUATION, NO_PROGRESS)
    assert stats["pairs"] == len(pairs) == sum(stats[f"pairs_{r}"] for r in reasons)
    seen: dict[str, list[tuple[str, bool]]] = {}  # prompt -> (action, success), train only
    for t in box_trajectories:
        for i, step in enumerate(t.steps):
            if t.split == "train":
                prompt = json.dumps(render_prompt(observation_at(t, i, SETTINGS), SETTINGS))
                seen.setdefault(prompt, []).append((step.action, t.success))
    for p in pairs:
        assert p.chosen_action != p.rejected_action
        assert p.chosen.endswith(f"<action>{p.chosen_action}</action>")
        visits = seen[json.dumps(list(p.messages))]
        assert (p.chosen_action, True) in visits  # taken at this prompt by a train success
        assert any(a == p.rejected_action for a, _ in visits)  # and the rejected one too
        assert p.task_id not in {"box-8", "box-9"}
    # the start of box-0: the expert's first move vs an invalid command and a useless look
    assert _at_start(pairs) == {("go east", "sing", INVALID), ("go east", "look", NO_PROGRESS)}
    # in the vault after "go east": taking the key vs walking back out (that episode failed)
    vault = {(p.chosen_action, p.rejected_action, p.reason) for p in pairs if _n_history(p) == 1}
    assert ("take key", "go west", FAILED_CONTINUATION) in vault
    capped, _ = build_pairs(box_trajectories, SETTINGS, max_rejected_per_state=1)
    assert _at_start(capped) == {("go east", "sing", INVALID)}  # invalid ones go first
    held_out = [t for t in box_trajectories if t.split != "train"]
    assert build_pairs(held_out, SETTINGS)[0] == []  # validation/test never give pairs


def _n_history(pair) -> int:
    return pair.messages[1]["content"].count(" -> ")


def _at_start(pairs) -> set[tuple[str, str, str]]:
    return {
        (p.chosen_action, p.rejected_action, p.reason)
        for p in pairs
        if p.task_id == "box-0" and _n_history(p) == 0
    }


def _loss(model, tokenizer, messages, answer) -> float:
    from components.experience.sft import completion_loss

    example = PolicyExample("x", "e", "t", 0, "expert", tuple(messages), answer)
    return completion_loss(model, tokenizer, [example])


def _params(model):
    return {k: v.detach().clone() for k, v in model.named_parameters()}


def _changed(before, model) -> bool:
    import torch

    return any(not torch.equal(before[k], v) for k, v in model.named_parameters())


@pytest.fixture(scope="module")
def sft_policy(box_trajectories, tmp_path_factory):
    """A tiny policy SFT'd on the box game's successful steps, with its train examples."""
    import torch

    from components.agent.baselines import load_base_policy, train_sft_policy

    torch.set_num_threads(1)  # contended 2-core machine: one thread is far faster
    acfg = _agent_cfg(max_steps=30, batch_size=4, learning_rate=3e-3, logging_steps=5)
    examples, _ = build_sft_examples(box_trajectories, SETTINGS)
    tmp = tmp_path_factory.mktemp("sft")
    model, tok = load_base_policy(acfg, list(corpus(examples)), tmp / "base", tmp / "tok")
    before = _params(model)
    loss_before = sum(_loss(model, tok, ex.messages, ex.answer) for ex in examples)
    model, result = train_sft_policy(model, tok, examples, acfg, tmp / "ckpt", fingerprint={"t": 1})
    return model, tok, examples, before, loss_before, result


def test_tiny_sft_changes_parameters_and_lowers_the_answer_loss(sft_policy):
    model, tok, examples, before, loss_before, result = sft_policy
    assert result.steps == 30 and result.n_train == len(examples)
    assert _changed(before, model)
    assert "forward" not in model.__dict__  # TRL's closure over the original is gone
    loss_after = sum(_loss(model, tok, ex.messages, ex.answer) for ex in examples)
    assert loss_after < 0.7 * loss_before
    assert result.last_loss < result.first_loss


def test_tiny_dpo_prefers_the_chosen_action_more(sft_policy, box_trajectories, tmp_path):
    import copy

    from components.agent.baselines import train_dpo_policy

    sft_model, tok, _, _, _, _ = sft_policy
    model = copy.deepcopy(sft_model)  # the module's SFT policy stays as it was
    pairs, _ = build_pairs(box_trajectories, SETTINGS)
    acfg = _agent_cfg()
    dpo = {"max_steps": 12, "batch_size": 4, "learning_rate": 3e-3, "beta": 0.5, "logging_steps": 2}
    acfg = acfg.model_copy(update={"dpo": acfg.dpo.model_copy(update=dpo)})

    def margin(m) -> float:  # mean loss of rejected minus chosen answers: higher = prefers chosen
        return sum(
            _loss(m, tok, p.messages, p.rejected) - _loss(m, tok, p.messages, p.chosen)
            for p in pairs
        ) / len(pairs)

    before, margin_before = _params(model), margin(model)
    trained, result = train_dpo_policy(
        model, tok, pairs, acfg, tmp_path / "ckpt", fingerprint={"t": 1}
    )
    assert result.steps == 12 and result.n_pairs == len(pairs) and result.n_dropped_too_long == 0
    assert _changed(before, trained)
    assert margin(trained) > margin_before + 0.1
    assert result.last_accuracy is not None and result.last_loss < result.first_loss
