"""The synthetic env: batched == unbatched, invalid actions, malformed answers, limits."""

from __future__ import annotations

import pytest

from components.config import SyntheticEnvConfig
from components.envs.base import ADMISSIBLE, FEEDBACK, VALID, WON, Env
from components.experience.synthetic_env import (
    MALFORMED,
    RESAMPLED,
    SyntheticEnv,
    VectorSyntheticEnv,
    generate_fns,
    world_key,
)
from components.lm.generate import Generator
from tests.factories import make_task
from tests.synthetic.conftest import (
    INSTRUCTION,
    INVALID_ACTION,
    SETTINGS,
    answer_for,
    pool_retriever,
)

CFG = SyntheticEnvConfig(max_steps=4, max_new_tokens=56, gen_batch_size=8)
NO_REPLAY = SETTINGS.__class__(history_len=2, k=0, with_reasoning=True)


class CountingGenerate:
    """A backend wrapper that records every batched call (to count calls per step)."""

    def __init__(self, fn):
        self.fn = fn
        self.calls: list[int] = []

    def __call__(self, prompts):
        self.calls.append(len(prompts))
        return self.fn(prompts)


def scripted(answers):
    """A backend that answers every prompt with ``answers(prompt)``."""
    return lambda prompts: [answers(p) for p in prompts]


def action_for(slot: int, step: int) -> str:
    # odd slots start with the invalid action of the training data: the episodes diverge
    # while staying in distribution, and prompts differ in length (left padding is used)
    if slot % 2 and step == 0:
        return INVALID_ACTION
    return f"go east {step}"


def _run_vector(venv, tasks, steps):
    venv.reset(tasks)
    outs = []
    for t in range(steps):
        outs.append(venv.step([action_for(i, t) for i in range(len(tasks))]))
        if venv.done:
            break
    return outs


def test_batched_and_unbatched_stepping_give_the_same_transitions(tiny_lm, index, pool, tasks):
    model, tok = tiny_lm
    # greedy resampling too: a sampled resample draws different random numbers when it
    # serves two prompts at once than one at a time, so only greedy is batch-invariant
    generate, _ = generate_fns(Generator(model, tok), CFG)
    counting = CountingGenerate(generate)
    slots = [tasks[0], tasks[1], tasks[0], tasks[1]]
    venv = VectorSyntheticEnv(
        counting,
        index,
        cfg=CFG,
        prompt=SETTINGS,
        retriever=pool_retriever(pool),
        resample=generate,
    )
    outs = _run_vector(venv, slots, CFG.max_steps)
    batched = venv.trajectories(policy="test")

    singles = []
    for slot, task in enumerate(slots):
        env = SyntheticEnv(
            generate,
            index,
            cfg=CFG,
            prompt=SETTINGS,
            retriever=pool_retriever(pool),
            resample=generate,
        )
        env.reset(task)
        for t in range(CFG.max_steps):
            *_, terminated, truncated, _ = env.step(action_for(slot, t))
            if terminated or truncated:
                break
        singles.append(env.trajectory(policy="test"))

    assert len(batched) == len(singles) == 4
    for b, s in zip(batched, singles, strict=True):
        key = [(t.state, t.action, t.next_state, t.reward, t.valid_action) for t in b.steps]
        assert key == [(t.state, t.action, t.next_state, t.reward, t.valid_action) for t in s.steps]
        assert b.success == s.success and b.truncated == s.truncated
    # the overfitted model walks the rooms it was trained on: real multi-step episodes
    assert [t.n_steps for t in batched[::2]] == [CFG.max_steps] * 2
    assert (
        venv.metrics()["steps"]
        == sum(t.n_steps for t in batched) + venv.metrics()["n_failed_malformed"]
    )
    assert [t.steps[0].next_state.splitlines()[0] for t in batched[::2]] == ["Location: Room 1"] * 2
    # one generate call per step for all live episodes, live count shrinking as they end
    assert len(counting.calls) == len(outs)
    assert counting.calls[0] == 4 and counting.calls == sorted(counting.calls, reverse=True)


def test_synthetic_env_implements_the_env_protocol(index, tasks):
    env = SyntheticEnv(
        scripted(lambda p: answer_for("Location: Room 1\nInventory: nothing")),
        index,
        cfg=CFG,
        prompt=NO_REPLAY,
    )
    assert isinstance(env, Env)
    obs, info = env.reset(tasks[0])
    assert obs == index.initial_state("tw-quest-0")
    assert info[ADMISSIBLE] == ["go east 0", "look"]
    obs, reward, terminated, truncated, info = env.step("go east 0")
    assert obs.startswith("Location: Room 1") and reward == 0
    assert not terminated and not truncated and info[VALID] is True
    assert info[FEEDBACK] == "Location: Room 1 Inventory: nothing"  # no Feedback line


def test_invalid_action_follows_the_models_failure_path(tiny_lm, index, pool, tasks):
    model, tok = tiny_lm
    generate, resample = generate_fns(Generator(model, tok), CFG)
    env = SyntheticEnv(
        generate, index, cfg=CFG, prompt=SETTINGS, retriever=pool_retriever(pool), resample=resample
    )
    state, info = env.reset(tasks[0])
    assert INVALID_ACTION not in info[ADMISSIBLE]
    obs, reward, terminated, truncated, info = env.step(INVALID_ACTION)
    assert info[VALID] is False
    assert (reward, terminated, truncated, info[MALFORMED]) == (0, False, False, False)
    assert world_key(obs) == world_key(state)  # the model learnt: nothing changes
    # the episode goes on after an invalid action
    obs, *_ = env.step("go east 0")
    step = env.trajectory(policy="test").steps[0]
    assert step.valid_action is False and step.action == INVALID_ACTION


def test_malformed_answer_is_resampled_once_then_fails_the_episode(index, tasks):
    garbage = CountingGenerate(scripted(lambda p: "the chest is <state>open"))
    resample = CountingGenerate(scripted(lambda p: "still <reward>garbage"))
    venv = VectorSyntheticEnv(garbage, index, cfg=CFG, prompt=NO_REPLAY, resample=resample)
    venv.reset(tasks)
    outs = venv.step(["go east 0", "look"])
    for out in outs:
        assert out is not None
        _obs, reward, terminated, truncated, info = out
        assert (reward, terminated, truncated) == (0, True, False)
        assert info[MALFORMED] and info[RESAMPLED] and not info[WON]
    assert venv.done
    assert resample.calls == [2]  # one batched resample of both malformed answers
    m = venv.metrics()
    assert (m["n_malformed"], m["n_resampled"], m["n_failed_malformed"]) == (4, 2, 2)
    assert venv.trajectories(policy="test") == []  # nothing recorded from a failed step
    assert venv.step(["go east 1", "look"]) == [None, None]  # finished slots are masked


def test_a_repaired_answer_continues_the_episode(index, tasks):
    room1 = "Location: Room 1\nA plain room.\nInventory: nothing\nFeedback: ok"
    venv = VectorSyntheticEnv(
        scripted(lambda p: "<think>half"),
        index,
        cfg=CFG,
        prompt=NO_REPLAY,
        resample=scripted(lambda p: answer_for(room1)),
    )
    venv.reset([tasks[0]])
    obs, _reward, terminated, _, info = venv.step(["go east 0"])[0]
    assert obs == room1 and not terminated and info[RESAMPLED] and not info[MALFORMED]
    assert info[ADMISSIBLE] == ["go east 1", "look"]  # looked up at the new world state
    m = venv.metrics()
    assert (m["n_malformed"], m["n_resampled"], m["n_repaired"], m["n_failed_malformed"]) == (
        1,
        1,
        1,
        0,
    )


def test_reward_terminates_and_max_steps_truncates(index, tasks):
    cfg = SyntheticEnvConfig(max_steps=2)
    won = VectorSyntheticEnv(
        scripted(lambda p: answer_for("Location: Vault", 1)), index, cfg=cfg, prompt=NO_REPLAY
    )
    won.reset([tasks[0]])
    _, reward, terminated, truncated, info = won.step(["open chest"])[0]
    assert (reward, terminated, truncated, info[WON]) == (1, True, False, True)
    assert won.trajectories(policy="t")[0].success

    loop = VectorSyntheticEnv(
        scripted(lambda p: answer_for("Location: Hall")), index, cfg=cfg, prompt=NO_REPLAY
    )
    loop.reset([tasks[0]])
    assert loop.step(["wait"])[0].truncated is False
    out = loop.step(["wait"])[0]
    assert out.truncated and not out.terminated and loop.done
    traj = loop.trajectories(policy="t")[0]
    assert traj.truncated and not traj.success and traj.steps[-1].done


def test_generated_task_gets_one_model_written_initial_state_per_group(index, tasks):
    gen = make_task(
        "gen-quest-abc",
        "Find the lamp and light it.",
        1,
        generated=True,
        parent_task_id="tw-quest-0",
    )
    calls = CountingGenerate(scripted(lambda p: "<state>Location: Study\nA lamp.</state>"))
    venv = VectorSyntheticEnv(calls, index, cfg=CFG, prompt=NO_REPLAY)
    first = venv.reset([gen, gen, tasks[0]])
    assert [o for o, _ in first[:2]] == ["Location: Study\nA lamp."] * 2
    assert first[2][0] == index.initial_state("tw-quest-0")  # known task: real state
    assert calls.calls == [1]  # one prompt for the whole group
    venv.reset([gen])
    assert calls.calls == [1]  # cached across resets
    # the parent's state when the model cannot write one
    other = gen.model_copy(update={"task_id": "gen-quest-def"})
    broken = VectorSyntheticEnv(scripted(lambda p: "no tags"), index, cfg=CFG, prompt=NO_REPLAY)
    ((obs, _),) = broken.reset([other])
    assert obs == index.initial_state("tw-quest-0")
    assert broken.metrics()["n_init_fallback"] == 1
    orphan = other.model_copy(update={"task_id": "gen-quest-xyz", "parent_task_id": None})
    ((obs, info),) = broken.reset([orphan])
    assert obs == "" and info[MALFORMED] and broken.done
    unknown = tasks[0].model_copy(update={"task_id": "tw-quest-404"})
    with pytest.raises(KeyError, match="tw-quest-404"):
        broken.reset([unknown])


def test_trajectories_are_stamped_per_iteration(index, tasks):
    venv = VectorSyntheticEnv(
        scripted(lambda p: answer_for("Location: Hall")), index, cfg=CFG, prompt=NO_REPLAY
    )
    venv.reset([tasks[0]])
    venv.step(["go east 0"])
    a = venv.trajectories(policy="grpo", iteration=1, checkpoint="ckpt-1")[0]
    b = venv.trajectories(policy="grpo", iteration=2, checkpoint="ckpt-2")[0]
    assert a.source == "synthetic" and a.steps[0].source == "synthetic"
    assert a.steps[0].provenance.iteration == 1 and a.steps[0].provenance.checkpoint == "ckpt-1"
    assert a.steps[0].id != b.steps[0].id and a.episode_id != b.episode_id
    assert a.steps[0].instruction == INSTRUCTION


def test_prompt_follows_the_ablation_switches(index, pool, tasks):
    seen = []
    venv = VectorSyntheticEnv(
        lambda prompts: seen.extend(prompts) or [answer_for("Location: Hall")] * len(prompts),
        index,
        cfg=CFG,
        prompt=SETTINGS,
        retriever=pool_retriever(pool),
    )
    venv.reset([tasks[0]])
    venv.step(["go east 0"])
    venv.step(["go east 1"])
    user = seen[-1][1]["content"]
    assert "Similar past transitions:" in user and "Recent history:" in user
    flat = VectorSyntheticEnv(
        lambda prompts: (
            seen.extend(prompts)
            or ["<state>Location: Hall</state><reward>0</reward>"] * len(prompts)
        ),
        index,
        cfg=CFG,
        prompt=SETTINGS.__class__(history_len=0, k=0, with_reasoning=False),
    )
    flat.reset([tasks[0]])
    flat.step(["go east 0"])
    out = flat.step(["go east 1"])[0]
    user = seen[-1][1]["content"]
    assert "Similar past transitions:" not in user and "Recent history:" not in user
    assert out is not None and out.info[MALFORMED] is False  # no <think> expected
    with pytest.raises(ValueError, match="retriever"):
        VectorSyntheticEnv(lambda p: [], index, cfg=CFG, prompt=SETTINGS)


def test_restart_finished_keeps_the_batch_full(index, tasks):
    venv = VectorSyntheticEnv(
        scripted(lambda p: answer_for("Location: Vault", int("open chest" in p[1]["content"]))),
        index,
        cfg=SyntheticEnvConfig(max_steps=3),
        prompt=NO_REPLAY,
    )
    venv.reset(tasks)
    venv.step(["open chest", "look"])
    assert venv.active == [False, True] and venv.restart_finished().keys() == {0}
    assert venv.active == [True, True] and venv.tasks == list(tasks)
    venv.step(["look", "look"])
    trajs = venv.trajectories(policy="t")
    assert [t.n_steps for t in trajs] == [1, 1, 2] and trajs[0].success
    assert len({t.episode_id for t in trajs}) == 3


def test_from_config_applies_the_ablations_and_the_models_own_prompt(tiny_lm, index, tasks):
    from components.config import AblationConfig, load_config
    from components.experience.synthetic_env import prompt_settings

    cfg = load_config(profile="ci")
    full = prompt_settings(cfg)
    assert (full.history_len, full.k, full.with_reasoning) == (2, 3, True)
    ablated = cfg.model_copy(
        update={"ablation": AblationConfig(no_replay=True, no_history=True, no_reasoning=True)}
    )
    target = cfg.experience.state_target
    assert prompt_settings(ablated) == SETTINGS.__class__(0, 0, False, target)
    # a trained model's own prompt (its meta) wins over the config, state target included
    meta = {"prompt": {"history_len": 1, "k": 0, "with_reasoning": True, "state_target": "full"}}
    assert prompt_settings(cfg, meta) == SETTINGS.__class__(1, 0, True, "full")
    with pytest.raises(ValueError, match="buffer"):
        VectorSyntheticEnv.from_config(cfg, Generator(*tiny_lm), index)
    venv = VectorSyntheticEnv.from_config(ablated, Generator(*tiny_lm), index)
    venv.reset([tasks[0]])
    out = venv.step(["go east 0"])[0]
    assert out is not None and venv.cfg.max_new_tokens == cfg.synthetic.max_new_tokens
    assert venv.prompt.k == 0 and venv.retriever is None


def test_llm_dream_env_decodes_the_served_model_on_its_server_and_variants_here(
    tiny_lm, index, tasks, tmp_path, monkeypatch
):
    import json

    import components.lm.models as models
    import components.lm.serving as serving
    from components.config import Paths, load_config
    from components.experience.sft import META_FILE
    from components.stages.experience import llm_dream_env

    loaded, served = [], []
    monkeypatch.setattr(models, "load_pretrained_dir", lambda d: loaded.append(d) or tiny_lm)
    monkeypatch.setattr(
        serving, "experience_backend", lambda s, root: served.append(s) or Generator(*tiny_lm)
    )
    meta = {"prompt": {"history_len": 1, "k": 0, "with_reasoning": True, "state_target": "full"}}
    full, variant = tmp_path / "models/experience/full", tmp_path / "models/experience/no_history"
    for d in (full, variant):
        d.mkdir(parents=True)
        (d / META_FILE).write_text(json.dumps(meta))
    cfg = load_config(profile="ci")
    cfg = cfg.model_copy(
        update={
            "serving": cfg.serving.model_copy(
                update={"backend": "openai", "experience_model": "models/experience/full"}
            )
        }
    )
    paths = Paths(tmp_path)
    venv = llm_dream_env(cfg, paths, full, index, "t")
    assert len(served) == 1 and loaded == []  # the server's copy, not a second one here
    assert venv.prompt.k == 0 and venv.prompt.history_len == 1  # the model's own prompt
    venv.reset([tasks[0]])
    assert venv.step(["go east 0"])[0] is not None
    llm_dream_env(cfg, paths, variant, index, "t")  # an ablation variant is not served
    assert loaded == [variant] and len(served) == 1
    meta["prompt"]["k"] = 2
    (variant / META_FILE).write_text(json.dumps(meta))
    with pytest.raises(FileNotFoundError, match="build-buffer"):
        llm_dream_env(cfg, paths, variant, index, "t")


def test_sampling_seeds_follow_the_run_and_survive_a_resume(index, tasks):
    """Each run (namespace) samples with its own seeds, and a resumed env draws the seeds
    the uninterrupted one drew (the call count alone repeated them for every RL seed)."""
    from components.config import AblationConfig, load_config

    cfg = load_config(profile="ci")
    cfg = cfg.model_copy(
        update={
            "ablation": AblationConfig(no_replay=True),
            "synthetic": cfg.synthetic.model_copy(update={"temperature": 0.7}),
        }
    )

    class Seeds:
        def __init__(self) -> None:
            self.seeds: list[int | None] = []

        def generate(self, prompts, **kw):
            self.seeds.append(kw["seed"])
            return [answer_for(p) for p in prompts]

    def run(namespace: str, state=None, rounds: int = 2) -> tuple[list[int | None], dict]:
        backend = Seeds()
        env = VectorSyntheticEnv.from_config(cfg, backend, index, namespace=namespace)
        if state is not None:
            env.load_state_dict(state)
        for _ in range(rounds):
            env.reset(tasks[:2])
            env.step(["go east 0", "go east 0"])
        return backend.seeds, env.state_dict()

    seed0, _ = run("dreamgym_grpo-seed0")
    assert None not in seed0 and len(set(seed0)) == len(seed0)
    assert set(run("dreamgym_grpo-seed1")[0]).isdisjoint(seed0)
    first, state = run("dreamgym_grpo-seed0", rounds=1)
    resumed, _ = run("dreamgym_grpo-seed0", state=state, rounds=1)
    assert first + resumed == seed0
