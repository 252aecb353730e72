"""Multi-turn GRPO/PPO on a tiny policy: advantages, losses, masks, learning, resume, counts."""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest

from components.agent.grpo import group_advantages
from components.agent.policy import PolicySettings, render_answer
from components.agent.policy_base import MALFORMED_ACTION, ActResult
from components.agent.policy_model import PolicyModel
from components.agent.ppo import gae, normalize
from components.agent.rl import TurnRow, clipped_token_loss, episode_weighted, flatten
from components.agent.rollout import collect_rollouts
from components.agent.train import (
    CHECKPOINT_DIR,
    POLICY_DIR,
    SNAPSHOT_DIR,
    load_snapshot,
    snapshot_file,
    train_rl,
)
from components.envs.base import WON
from components.envs.vector import EnvList
from tests.agent.rl_env import (
    ANSWER_TOKENS,
    TARGET,
    WORDS,
    MagicWordEnv,
    first_observation,
    magic_grpo,
    magic_task,
)
from tests.factories import each_rl_algo


def target_logprob(policy: PolicyModel, word: str = TARGET) -> float:
    """log pi(<action>word</action> | first observation), computed exactly (no sampling)."""
    import torch

    prompt = policy.prompt_ids([first_observation()])[0]
    answer = policy.tokenizer(render_answer(word, None), add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return float(policy.sequence_logprobs([prompt], [answer]).logprobs.sum())


def params_of(policy: PolicyModel) -> dict:
    """A detached copy of the weights."""
    return {k: v.detach().clone() for k, v in policy.model.state_dict().items()}


# -- advantages and losses against hand-computed values ------------------------------------


def test_group_advantages_hand_computed_and_trl_formula() -> None:
    import torch
    from trl.trainer.utils import nanstd

    rewards = [1, 0, 0, 0, 1, 1, 1, 1, 1, 0]
    groups = [0, 0, 0, 0, 1, 1, 1, 1, 2, 2]
    adv = group_advantages(rewards, groups)
    # group 0: mean 0.25, unbiased std 0.5; group 1: all equal -> 0; group 2: std sqrt(0.5)
    expected = [0.75 / 0.5001] + [-0.25 / 0.5001] * 3 + [0.0] * 4
    expected += [0.5 / (math.sqrt(0.5) + 1e-4), -0.5 / (math.sqrt(0.5) + 1e-4)]
    assert adv == pytest.approx(expected, abs=1e-9)
    # TRL's formula on the equal-sized groups 0 and 1 (G = 4)
    r = torch.tensor(rewards[:8], dtype=torch.float32)
    mean = r.view(-1, 4).mean(1).repeat_interleave(4)
    std = nanstd(r.view(-1, 4), dim=1).repeat_interleave(4)
    trl_adv = ((r - mean) / (std + 1e-4)).tolist()
    assert adv[:8] == pytest.approx(trl_adv, abs=1e-6)
    assert group_advantages(rewards[:4], groups[:4], scale=False) == [0.75, -0.25, -0.25, -0.25]


def test_gae_over_turns_hand_computed() -> None:
    adv, ret = gae([0.0, 0.0, 1.0], [0.5, 0.2, 0.4], gamma=0.9, lam=0.8)
    # t2: 1 - 0.4 = 0.6; t1: 0.9*0.4 - 0.2 + 0.72*0.6 = 0.592; t0: 0.18 - 0.5 + 0.72*0.592
    assert adv == pytest.approx([0.10624, 0.592, 0.6])
    assert ret == pytest.approx([0.60624, 0.792, 1.0])
    # gamma = lambda = 1: Monte-Carlo return minus the value
    adv, _ = gae([0.0, 0.0, 1.0], [0.5, 0.2, 0.4], gamma=1.0, lam=1.0)
    assert adv == pytest.approx([0.5, 0.8, 0.6])


def test_episode_aggregation_weighs_every_episode_the_same() -> None:
    act = ActResult("look", "look", None, None, (1,), (2,), (-0.5,))
    # a 1-turn success (A=+1) and a 3-turn failure (A=-1) of the same group
    rows = [TurnRow(0, act, 1.0)] + [TurnRow(1, act, -1.0) for _ in range(3)]
    weighted = episode_weighted(rows)
    assert [r.advantage for r in weighted] == pytest.approx([2.0, -2 / 3, -2 / 3, -2 / 3])
    assert sum(r.advantage for r in weighted) == pytest.approx(0.0)  # per turn it was -2
    assert [r.advantage for r in rows] == [1.0, -1.0, -1.0, -1.0]  # the input is untouched


def test_normalize_within_groups() -> None:
    out = normalize([1.0, 2.0, 3.0, 10.0, 30.0], ["a", "a", "a", "b", "b"])
    assert out[:3] == pytest.approx([-1.2247, 0.0, 1.2247], abs=1e-4)
    assert out[3:] == pytest.approx([-1.0, 1.0], abs=1e-6)
    assert normalize([2.0, 4.0]) == pytest.approx([-1.0, 1.0], abs=1e-6)


def test_clipped_token_loss_hand_computed() -> None:
    import torch

    logps = torch.tensor([[math.log(1.5), math.log(0.5), 0.0]])
    old = torch.zeros(1, 3)
    adv = torch.tensor([[1.0, -1.0, 2.0]])
    loss, st = clipped_token_loss(logps, old, None, adv, clip_low=0.2, clip_high=0.2, beta=0.0)
    # ratio 1.5 with A>0 is clipped to 1.2; ratio 0.5 with A<0 clipped to 0.8; ratio 1 kept
    assert loss.tolist()[0] == pytest.approx([-1.2, 0.8, -2.0])
    assert st["clip"].tolist()[0] == [True, True, False]
    ref = logps + 0.5
    k3 = math.exp(0.5) - 0.5 - 1
    loss_kl, st = clipped_token_loss(
        logps, old, ref, adv, clip_low=0.2, clip_high=0.2, beta=0.1, kl_ratio_correction=False
    )
    assert (loss_kl - loss).tolist()[0] == pytest.approx([0.1 * k3] * 3, abs=1e-6)
    assert st["kl"].tolist()[0] == pytest.approx([k3] * 3, abs=1e-6)
    # with the importance weight (samples came from the old policy): k3 * ratio
    loss_kl, _ = clipped_token_loss(logps, old, ref, adv, clip_low=0.2, clip_high=0.2, beta=0.1)
    expected = [0.1 * k3 * r for r in (1.5, 0.5, 1.0)]
    assert (loss_kl - loss).tolist()[0] == pytest.approx(expected, abs=1e-6)


# -- the policy: sampling, stop, malformed, masks -------------------------------------------


def test_act_stops_at_action_and_logprobs_match_rescoring(magic_policy: PolicyModel) -> None:
    import torch

    torch.manual_seed(0)
    acts = magic_policy.act([first_observation()] * 8, temperature=1.0, max_new_tokens=16)
    well_formed = [a for a in acts if not a.malformed]
    assert len(well_formed) >= 6  # the warm start answers in the format
    for a in well_formed:
        assert a.completion_ids[-1] == magic_policy.stop_id
        assert a.text.endswith("</action>")
        assert a.action in WORDS
    rescored = magic_policy.completion_logprobs(
        [a.prompt_ids for a in acts], [a.completion_ids for a in acts]
    )
    for a, lp in zip(acts, rescored, strict=True):
        assert len(a.logprobs) == len(a.completion_ids)
        assert lp == pytest.approx(a.logprobs, abs=1e-4)


def test_malformed_answers_take_the_invalid_action_path(magic_policy: PolicyModel) -> None:
    # the same weights, but the format now requires <think>: every answer is malformed
    strict = PolicyModel(magic_policy.model, magic_policy.tokenizer, PolicySettings())
    venv = EnvList(factory=lambda: MagicWordEnv(max_steps=2))
    batch = collect_rollouts(strict, venv, [magic_task()] * 3, max_new_tokens=12)
    turns = [t for e in batch.episodes for t in e.turns]
    assert len(turns) == 6 and all(t.act.malformed for t in turns)
    assert {t.act.action for t in turns} == {MALFORMED_ACTION}
    assert all(t.act.error and "think" in t.act.error for t in turns)
    assert not any(t.valid for t in turns) and not any(e.success for e in batch.episodes)
    assert batch.metrics()["malformed_rate"] == 1.0
    assert all(t.act.completion_ids and t.act.logprobs for t in turns)  # still trainable


def test_observation_tokens_are_never_scored(magic_policy: PolicyModel) -> None:
    import torch

    venv = EnvList(factory=lambda: MagicWordEnv(max_steps=3))
    task = magic_task(target="nothing-opens-it")  # every episode: 3 turns
    torch.manual_seed(1)
    batch = collect_rollouts(magic_policy, venv, [task] * 2, max_new_tokens=12)
    rows = flatten(batch.episodes)
    assert len(rows) == 6
    tok = magic_policy.tokenizer
    for ep in batch.episodes:
        for i, t in enumerate(ep.turns):
            prompt, completion = tok.decode(t.act.prompt_ids), tok.decode(t.act.completion_ids)
            assert ("Nothing happens." in prompt) == (i > 0)  # env feedback lives in prompts
            assert "Nothing happens." not in completion and "Current state" not in completion
    scores = magic_policy.sequence_logprobs(
        [r.act.prompt_ids for r in rows], [r.completion_ids for r in rows]
    )
    lengths = [len(r.completion_ids) for r in rows]
    # one scored position per completion token, nothing for prompt (observation) tokens
    assert scores.logprobs.shape[1] == max(lengths)
    assert scores.mask.sum(-1).tolist() == [float(n) for n in lengths]
    # the scored values are the completion positions of a plain full-sequence forward
    r = rows[-1]
    ids = torch.tensor([list(r.act.prompt_ids) + list(r.completion_ids)])
    with torch.no_grad():
        full = torch.log_softmax(magic_policy.model(input_ids=ids).logits[0, :-1].float(), -1)
    n_p = len(r.act.prompt_ids)
    expected = full[n_p - 1 :].gather(-1, ids[0, n_p:].unsqueeze(-1)).squeeze(-1)
    got = scores.logprobs[-1, : len(r.completion_ids)]
    assert torch.allclose(got.detach(), expected, atol=1e-4)


def test_the_policys_scoring_batch_caps_the_micro_batch(magic_policy: PolicyModel) -> None:
    # the scorer's default micro-batch (256 turns) grew an LM policy to 19.5 GB: an LM
    # policy's own scoring batch must cap what one forward pass holds
    import torch

    from components.agent.rl import optimize

    venv = EnvList(factory=lambda: MagicWordEnv(max_steps=2))
    torch.manual_seed(0)
    batch = collect_rollouts(magic_policy, venv, [magic_task()] * 5, max_new_tokens=12)
    rows = flatten(batch.episodes)
    for i, r in enumerate(rows):
        r.advantage, r.ref_logprobs = (1.0 if i % 2 else -1.0), tuple(r.act.logprobs)
    sizes: list[int] = []
    score = magic_policy._score

    def spy(acts, *args):
        sizes.append(len(acts))
        return score(acts, *args)

    magic_policy._score, magic_policy.score_batch_size = spy, 3
    cfg = magic_grpo(micro_batch_size=256, minibatch_size=None, epochs=1)
    out = optimize(
        magic_policy,
        torch.optim.SGD(magic_policy.model.parameters(), lr=0.0),
        rows,
        cfg,
        params=list(magic_policy.model.parameters()),
        seed=0,
    )
    assert len(rows) == 10 and out["optimizer_steps"] == 1
    assert sizes == [3, 3, 3, 1]


def test_a_trainable_lm_policy_checkpoints_activations_with_the_same_gradients(
    magic_policy: PolicyModel, tmp_path: Path
) -> None:
    import torch

    from components.agent.loading import load_policy
    from components.config import AgentConfig

    rows = [first_observation()] * 3
    prompts = magic_policy.prompt_ids(rows)
    answer = magic_policy.tokenizer(render_answer(TARGET, None), add_special_tokens=False)

    def grads(policy: PolicyModel) -> list[torch.Tensor]:
        policy.model.train()
        policy.model.zero_grad()
        policy.sequence_logprobs(prompts, [answer["input_ids"]] * 3).logprobs.sum().backward()
        return [p.grad.clone() for p in policy.model.parameters()]

    magic_policy.save(tmp_path)
    plain = grads(magic_policy)
    acfg = AgentConfig()
    assert acfg.gradient_checkpointing  # on by default
    loaded = load_policy(tmp_path, acfg, trainable=True)
    assert loaded.checkpoints_activations
    assert not load_policy(tmp_path, acfg).checkpoints_activations  # evaluation
    for a, b in zip(plain, grads(loaded), strict=True):
        assert torch.allclose(a, b, atol=1e-5)


# -- real-step accounting ------------------------------------------------------------------


def test_real_step_counter_is_exact(magic_policy: PolicyModel, tmp_path: Path) -> None:
    envs = [MagicWordEnv(max_steps=2) for _ in range(4)]
    venv = EnvList(envs)
    batch = collect_rollouts(magic_policy, venv, [magic_task()] * 4, max_new_tokens=12)
    n_turns = sum(len(e.turns) for e in batch.episodes)
    assert batch.real_steps == venv.real_steps == n_turns == sum(e.steps for e in envs)
    assert venv.real_resets == 4

    made: list[MagicWordEnv] = []

    def factory() -> MagicWordEnv:
        made.append(MagicWordEnv(max_steps=2))
        return made[-1]

    seen: list[int] = []
    cfg = magic_grpo(iterations=2, tasks_per_iteration=1, rollouts_per_task=3)
    out = train_rl(
        magic_policy,
        factory,
        [magic_task()],
        cfg,
        tmp_path,
        on_rollouts=lambda it, b: seen.append(sum(len(e.turns) for e in b.episodes)),
    )
    assert out["real_steps"] == sum(seen) == sum(e.steps for e in made)
    assert len(made) == 3  # the pool grew to the batch, then was reused


# -- learning ------------------------------------------------------------------------------


@each_rl_algo(
    grpo={"tasks_per_iteration": 2, "rollouts_per_task": 8},
    ppo={"tasks_per_iteration": 16, "value_learning_rate": 1e-2},
    iterations=6,
    learning_rate=5e-4,
    max_new_tokens=ANSWER_TOKENS,
    save_every=100,
)
def test_updates_raise_the_rewarded_action(magic_policy: PolicyModel, cfg, tmp_path: Path) -> None:
    before_lp, before = target_logprob(magic_policy), params_of(magic_policy)
    history: list[dict] = []
    out = train_rl(
        magic_policy,
        lambda: MagicWordEnv(max_steps=1),
        [magic_task()],
        cfg,
        tmp_path,
        log_fn=lambda m, step: history.append(m),
        snapshots=True,
    )
    after_lp = target_logprob(magic_policy)
    changed = [k for k, v in params_of(magic_policy).items() if not v.equal(before[k])]
    assert changed  # the update moved the weights
    # the warm start says each word with p ~ 1/3 (log p ~ -1.1); RL must raise the target's
    assert after_lp > before_lp + 0.3, (before_lp, after_lp)
    first = sum(h["success_rate"] for h in history[:2]) / 2
    last = sum(h["success_rate"] for h in history[-2:]) / 2
    assert last > first
    assert out["iterations"] == 6 and out["real_steps"] == 6 * 16
    assert (tmp_path / POLICY_DIR / "config.json").exists()
    reloaded = PolicyModel.from_dir(tmp_path / POLICY_DIR)
    assert reloaded.settings == magic_policy.settings
    assert target_logprob(reloaded) == pytest.approx(after_lp, abs=1e-4)
    # Theorem-1 inputs: every update's KL, and pi_0 .. pi_6 kept as snapshots
    assert all(h["policy_kl"] >= 0 for h in history)
    assert any(h["policy_kl"] > 0 for h in history if h["optimizer_steps"])
    assert sorted(p.name for p in (tmp_path / SNAPSHOT_DIR).iterdir()) == [
        f"iter-{k}.pt" for k in range(7)
    ]
    load_snapshot(reloaded, snapshot_file(tmp_path, 0))
    assert target_logprob(reloaded) == pytest.approx(before_lp, abs=1e-4)
    load_snapshot(reloaded, snapshot_file(tmp_path, 6))
    assert target_logprob(reloaded) == pytest.approx(after_lp, abs=1e-4)


# -- checkpoints ---------------------------------------------------------------------------


class Interrupt(Exception):
    """Stands in for a kill in the middle of training."""


@each_rl_algo(
    grpo={"tasks_per_iteration": 1, "rollouts_per_task": 4},
    ppo={"tasks_per_iteration": 4},
    iterations=4,
    learning_rate=5e-4,
    max_new_tokens=ANSWER_TOKENS,
    save_every=2,
)
def test_resume_after_interruption_matches_uninterrupted_run(
    magic_policy_state, one_thread, cfg, tmp_path: Path
) -> None:
    import copy

    base, state = magic_policy_state

    def fresh() -> PolicyModel:
        model = copy.deepcopy(base.model)
        model.load_state_dict(state)
        return PolicyModel(model, base.tokenizer, base.settings)

    def env() -> MagicWordEnv:
        return MagicWordEnv(max_steps=2)

    straight = fresh()
    ref = train_rl(straight, env, [magic_task()], cfg, tmp_path / "a", snapshots=True)

    def crash_at_3(metrics: dict, step: int) -> None:
        if step == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        train_rl(
            fresh(), env, [magic_task()], cfg, tmp_path / "b", log_fn=crash_at_3, snapshots=True
        )
    assert [p.name for p in (tmp_path / "b" / CHECKPOINT_DIR).glob("ckpt-*")] == ["ckpt-2"]
    resumed = fresh()  # a new process would reload the same start model
    steps: list[int] = []
    out = train_rl(
        resumed,
        env,
        [magic_task()],
        cfg,
        tmp_path / "b",
        log_fn=lambda m, s: steps.append(s),
        snapshots=True,
    )
    assert out["resumed"] == 1 and steps == [3, 4]
    assert out["iterations"] == ref["iterations"] == 4
    assert out["real_steps"] == ref["real_steps"] and out["episodes"] == ref["episodes"]
    a, b = params_of(straight), params_of(resumed)
    assert all(a[k].allclose(b[k], atol=1e-6) for k in a)
    import torch

    for k in range(5):  # the resumed run's snapshots are the uninterrupted run's
        sa, sb = (torch.load(snapshot_file(tmp_path / d, k)) for d in "ab")
        assert all(sa[n].allclose(sb[n], atol=1e-6) for n in sa)
    # a changed config is another run: its checkpoints are not resumed
    other = cfg.model_copy(update={"learning_rate": 1e-4})
    assert train_rl(fresh(), env, [magic_task()], other, tmp_path / "b")["resumed"] == 0


def test_real_step_budget_stops_training_after_a_checkpoint(
    magic_policy: PolicyModel, tmp_path: Path
) -> None:
    cfg = magic_grpo(
        iterations=10, tasks_per_iteration=1, rollouts_per_task=4, max_real_steps=5, save_every=100
    )
    out = train_rl(magic_policy, lambda: MagicWordEnv(max_steps=1), [magic_task()], cfg, tmp_path)
    # 4 single-step episodes per round: the round that crosses 5 real steps is the last
    assert out["iterations"] == 2 and out["real_steps"] == 8 and out["stopped_by_budget"] == 1
    assert [p.name for p in (tmp_path / CHECKPOINT_DIR).glob("ckpt-*")] == ["ckpt-2"]
    again = train_rl(magic_policy, lambda: MagicWordEnv(max_steps=1), [magic_task()], cfg, tmp_path)
    assert again["resumed"] == 1 and again["iterations"] == 2  # a spent budget stays spent


def test_the_wall_clock_budget_counts_the_time_before_a_resume(
    magic_policy: PolicyModel, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import time

    def run(cfg: object, out: Path) -> dict:
        return train_rl(magic_policy, lambda: MagicWordEnv(max_steps=1), [magic_task()], cfg, out)

    cfg = magic_grpo(iterations=2, tasks_per_iteration=1, rollouts_per_task=4)
    clock = iter(range(0, 10**7, 100))  # every reading 100 s on: each round takes minutes
    monkeypatch.setattr(time, "perf_counter", lambda: float(next(clock)))
    assert run(cfg, tmp_path)["iterations"] == 2
    # resumed with more rounds and a 5-minute budget the first run spent: no round more
    again = run(cfg.model_copy(update={"iterations": 10, "max_train_minutes": 5.0}), tmp_path)
    assert again["resumed"] == 1 and again["iterations"] == 2 and again["stopped_by_budget"] == 1
    # a zero real-step budget stops a fresh run before its first round
    none = run(cfg.model_copy(update={"max_real_steps": 0}), tmp_path / "zero")
    assert none["iterations"] == 0 and none["real_steps"] == 0


def test_lora_policy_trains_adapters_only_and_saves_merged(
    magic_policy: PolicyModel, tmp_path: Path
) -> None:
    from components.agent import checkpoint
    from components.agent.policy_model import LoraSettings
    from components.agent.rl import Reference

    base_lp = target_logprob(magic_policy)
    magic_policy.add_lora(LoraSettings(r=4, alpha=8))
    assert magic_policy.is_lora
    frozen = {n: p.detach().clone() for n, p in magic_policy.model.named_parameters()}
    cfg = magic_grpo(
        iterations=3, tasks_per_iteration=2, rollouts_per_task=8, learning_rate=5e-3, save_every=1
    )
    train_rl(magic_policy, lambda: MagicWordEnv(max_steps=1), [magic_task()], cfg, tmp_path)
    moved = {n for n, p in magic_policy.model.named_parameters() if not p.detach().equal(frozen[n])}
    assert moved and all("lora_" in n for n in moved)  # the base weights never move
    saved = checkpoint.load(checkpoint.latest(tmp_path / CHECKPOINT_DIR))["policy"]
    assert saved and all("lora_" in n for n in saved)  # checkpoints hold the adapters only
    # the reference is the base model with adapters off: the start policy, no copy
    ref = Reference(magic_policy)
    assert ref.copy is None
    prompt = magic_policy.prompt_ids([first_observation()])[0]
    answer = magic_policy.tokenizer(render_answer(TARGET, None), add_special_tokens=False)
    act = ActResult(TARGET, "", None, None, tuple(prompt), tuple(answer["input_ids"]), ())
    ref_lp = sum(ref.logprobs([act], 1.0)[0])
    assert ref_lp == pytest.approx(base_lp, abs=1e-4)
    trained_lp = target_logprob(magic_policy)
    assert trained_lp != pytest.approx(base_lp, abs=1e-3)
    merged = PolicyModel.from_dir(tmp_path / POLICY_DIR)  # a plain model, LoRA merged in
    assert not merged.is_lora
    assert target_logprob(merged) == pytest.approx(trained_lp, abs=1e-4)


def test_env_failures_end_the_episode_count_the_step_and_are_not_trained_on(
    magic_policy: PolicyModel,
) -> None:
    from components.agent.grpo import GRPO

    envs = [MagicWordEnv(max_steps=3), MagicWordEnv(max_steps=3, crash_at_step=2)]
    venv = EnvList(envs)
    task = magic_task(target="nothing-opens-it")
    batch = collect_rollouts(magic_policy, venv, [task, task], groups=[0, 0], max_new_tokens=12)
    ok, crashed = batch.episodes
    assert crashed.env_error == "the engine died" and len(crashed.turns) == 2
    assert crashed.terminated and not crashed.success and len(ok.turns) == 3
    assert batch.real_steps == 5 == sum(e.steps for e in envs)  # the failed step counts
    assert [r.episode for r in flatten(batch.episodes)] == [0, 0, 0]  # crash: not trained on
    keep_flat = magic_grpo(drop_zero_std_groups=False)
    assert GRPO(magic_policy, keep_flat).update(batch, 0)["train_turns"] == 3.0
    # by default a group without reward variance costs no update at all
    stats = GRPO(magic_policy, magic_grpo()).update(batch, 0)
    assert stats["train_turns"] == 0.0 and stats["optimizer_steps"] == 0.0


def test_actions_with_control_characters_are_malformed() -> None:
    from components.agent.policy_base import parse_policy_answer

    # TextWorld's frotz engine segfaults the process on "go\x13" (measured): never send it
    decision, error = parse_policy_answer("<action>go\x13</action>", with_reasoning=False)
    assert decision is None and error == "non-printable character in <action>"
    decision, error = parse_policy_answer("<action>take café</action>", with_reasoning=False)
    assert decision is not None and decision.action == "take café" and error is None
    decision, error = parse_policy_answer("<action>go", with_reasoning=False)
    assert decision is None and "unclosed" in (error or "")


def test_episodes_the_env_broke_do_not_update_the_task_sampler(
    magic_policy: PolicyModel, tmp_path: Path
) -> None:
    """A crashed (or S2R-cap-cut) episode says nothing of its task: counted as a failure,
    it made the variance sampler favour the task."""
    from components.curriculum.sampling import VarianceTaskSampler

    sampler = VarianceTaskSampler([magic_task()], seed=0)
    before = sampler.state_dict()
    cfg = magic_grpo(iterations=1, tasks_per_iteration=1, rollouts_per_task=2)
    crashing = lambda: MagicWordEnv(max_steps=3, crash_at_step=1)  # noqa: E731
    out = train_rl(magic_policy, crashing, sampler, cfg, tmp_path)
    assert out["iterations"] == 1 and sampler.state_dict() == before


def test_a_partial_score_is_not_a_success_to_the_task_sampler(
    magic_policy: PolicyModel, tmp_path: Path
) -> None:
    """Under ``env.reward: score`` a step can pay without winning: the sampler counted any
    positive reward as a win, so a task never solved looked half solved."""
    from components.curriculum.sampling import VarianceTaskSampler

    class Partial(MagicWordEnv):
        def step(self, action: str) -> tuple[str, Any, bool, bool, dict[str, Any]]:
            obs, _, _, _, info = super().step(action)
            return obs, 0.5, True, False, {**info, WON: False}  # pays, never wins

    sampler = VarianceTaskSampler([magic_task()], seed=0)
    cfg = magic_grpo(iterations=1, tasks_per_iteration=1, rollouts_per_task=2)
    train_rl(magic_policy, Partial, sampler, cfg, tmp_path)
    wins, n = sampler.stats[magic_task().task_id]
    assert n == 2 and wins == 0
