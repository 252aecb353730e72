"""The RL stages end to end: real-env GRPO, DreamGym (synthetic env only, curriculum,
co-evolving buffer), capped sim-to-real, on real TextWorld games with tiny models."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path
from typing import Any

import pytest

from components.agent.rl import flatten
from components.agent.rollout import ENV_ERROR, collect_rollouts
from components.config import Config, Paths, load_config
from components.stages.rl import BUDGET_CUT, CappedEnvList
from tests.agent.rl_env import MagicWordEnv, magic_task

ROOT = Path(__file__).resolve().parents[2]
# what the fixed-answer experience model says at every step: nothing happens, reward 0
QUIET_STATE = "Location: Nowhere\nFeedback: Nothing happens."


def test_capped_env_list_takes_exactly_its_budget() -> None:
    made: list[MagicWordEnv] = []

    def factory() -> MagicWordEnv:
        made.append(MagicWordEnv(max_steps=10))
        return made[-1]

    venv = CappedEnvList(factory, budget=7)
    venv.reset([magic_task()] * 3)
    outs = [venv.step(["please"] * 3) for _ in range(2)]  # 6 steps, nobody wins
    assert all(o is not None and ENV_ERROR not in o[4] for out in outs for o in out)
    third = venv.step(["please"] * 3)  # one step left: slot 0 steps, slots 1 and 2 are cut
    assert third[0] is not None and ENV_ERROR not in third[0][4]
    for cut in third[1:]:
        assert cut is not None and cut[2] and cut[4][ENV_ERROR] == BUDGET_CUT
    assert venv.active == [True, False, False]
    last = venv.step(["please", None, None])
    assert last[0] is not None and last[0][4][ENV_ERROR] == BUDGET_CUT and venv.done
    assert venv.real_steps == 7 == sum(e.steps for e in made)


def test_episodes_cut_by_the_budget_are_not_trained_on(magic_policy) -> None:
    venv = CappedEnvList(lambda: MagicWordEnv(max_steps=3), budget=4)
    batch = collect_rollouts(magic_policy, venv, [magic_task()] * 3, max_new_tokens=12)
    assert batch.real_steps == venv.real_steps <= 4
    cut = [i for i, e in enumerate(batch.episodes) if e.env_error == BUDGET_CUT]
    assert {r.episode for r in flatten(batch.episodes)}.isdisjoint(cut)


# ----------------------------------------------------------------------------- stages


def _config(suite_cfg: Config) -> Config:
    cfg = load_config(ROOT / "params.yaml", profile="ci")
    return cfg.model_copy(
        update={
            "env": suite_cfg.env,
            "collect": suite_cfg.collect,
            # room for the fixed answer (state + reward tags) whatever the tokenizer
            "synthetic": cfg.synthetic.model_copy(update={"max_new_tokens": 64}),
        }
    )


def _fixed_answer_experience_model(cfg: Config, trajectories: list[Any], out: Path) -> None:
    """A tiny experience model overfit to one well-formed answer (~5 s): it always predicts
    QUIET_STATE, reward 0, so synthetic episodes run to synthetic.max_steps."""
    import torch

    from components.experience.format import (
        SYSTEM_PROMPT,
        StepContext,
        parse_answer,
        render_answer,
        render_prompt,
    )
    from components.experience.sft import save_model
    from components.lm.generate import Generator
    from components.lm.models import build_tiny_model
    from components.lm.tokenizer import train_tokenizer
    from components.stages.experience import prompt_settings

    settings = prompt_settings(cfg)
    target = settings.state_target
    answer = render_answer(
        QUIET_STATE, 0, "Nothing changes.", state=QUIET_STATE, state_target=target
    )
    steps = [s for t in trajectories if t.split == "train" for s in t.steps]
    prompts = []
    for i, s in enumerate(steps[:8]):
        ctx = StepContext(
            instruction=s.instruction,
            state=QUIET_STATE if i % 3 == 2 else s.state,
            action=s.action,
            history=tuple((p.action, p.next_state) for p in steps[max(0, i - 2) : i]),
            retrieved=tuple(steps[i + 1 : i + 1 + settings.k]),
        )
        user = render_prompt(ctx, target)
        prompts.append(
            [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]
        )
    texts = [SYSTEM_PROMPT, answer, *(m["content"] for p in prompts for m in p)]
    tokenizer = train_tokenizer(texts * 3, vocab_size=512)
    model = build_tiny_model("nano", tokenizer, seed=0)
    rows = []
    for p in prompts:
        text = tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True)
        prompt_ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"]
        rows.append((prompt_ids + answer_ids, [-100] * len(prompt_ids) + answer_ids))
    width = max(len(ids) for ids, _ in rows)
    pad = tokenizer.pad_token_id
    ids = torch.tensor([r + [pad] * (width - len(r)) for r, _ in rows])
    labels = torch.tensor([lab + [-100] * (width - len(lab)) for _, lab in rows])
    mask = (labels != -100) | (
        torch.arange(width) < torch.tensor([len(r) for r, _ in rows])[:, None]
    )
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    model.train()
    for _ in range(120):
        loss = model(input_ids=ids, attention_mask=mask.long(), labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    generated = Generator(model, tokenizer).generate(
        prompts[:3], max_new_tokens=cfg.synthetic.max_new_tokens, stop=("</reward>",)
    )
    for text, p in zip(generated, prompts[:3], strict=True):  # fail here, not in the stages
        state = p[1]["content"].split("Current state:\n")[1].split("\n\nAction:")[0]
        parse_answer(text, settings.with_reasoning, state=state, state_target=target)
    save_model(model, tokenizer, out, {"base_model": "tiny", "prompt": settings.as_dict()})


@pytest.fixture(scope="module")
def project(agent_tw_suite, tmp_path_factory) -> tuple[Config, Paths]:
    """A project with real tasks, real trajectories, the seed buffer, an SFT policy and an
    experience model: what the RL stages read."""
    import torch

    from components.buffer import SEED_TAG, ReplayBuffer
    from components.data.collect import collect
    from components.schema import Trajectory, read_jsonl, write_jsonl
    from components.stages.agent import train_sft_baseline
    from components.stages.experience import model_dir

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    suite = agent_tw_suite
    cfg = _config(suite.cfg)
    paths = Paths(tmp_path_factory.mktemp("rl_stages"))
    shutil.copytree(suite.tasks_dir, paths.tasks)
    collect(cfg, suite.tasks, paths.raw, suite.root, progress=False)
    trajectories = [t for f in sorted(paths.raw.glob("*.jsonl")) for t in read_jsonl(f, Trajectory)]
    write_jsonl(paths.trajectories_file, trajectories)
    buffer = ReplayBuffer.open(paths.buffer, cfg.buffer)
    buffer.add([s for t in trajectories if t.split == "train" for s in t.steps])
    buffer.tag(SEED_TAG)
    train_sft_baseline(cfg, paths)
    _fixed_answer_experience_model(cfg, trajectories, model_dir(paths, "full"))
    yield cfg, paths
    torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def grpo_real(project) -> dict[str, Any]:
    """train_rl_real(grpo) on the project."""
    from components.stages.rl import train_rl_real

    cfg, paths = project
    return train_rl_real(cfg, paths, "grpo")


@pytest.fixture(scope="module")
def dreamgym_grpo(project) -> dict[str, Any]:
    """train_dreamgym(grpo) on the project."""
    from components.stages.rl import train_dreamgym

    cfg, paths = project
    return train_dreamgym(cfg, paths, "grpo")


def _history(paths: Paths, method: str) -> list[dict[str, Any]]:
    rows = (paths.metrics / "history" / f"{method}.jsonl").read_text().splitlines()
    as_plot = json.loads((paths.metrics / "history" / f"{method}.json").read_text())
    assert [json.loads(r) for r in rows] == as_plot  # the DVC plot holds the same rows
    return as_plot


def _common_outputs(paths: Paths, method: str, out: dict[str, Any], rounds: int) -> None:
    from components.stages.agent import checkpoint_dir, policy_dir

    meta = json.loads((policy_dir(paths, method) / "policy.json").read_text())
    assert meta["method"] == method and meta["real_steps"] == out["real_steps"]
    assert (policy_dir(paths, method) / "policy_settings.json").exists()
    saved = json.loads((paths.metrics / "agent" / f"{method}.json").read_text())
    for key in ("real_steps", "synthetic_steps", "wall_seconds", "success_rate_last"):
        assert saved[key] == out[key]
    assert 0 <= saved["malformed_rate_last"] <= 1
    history = _history(paths, method)
    assert [h["iteration"] for h in history] == list(range(1, rounds + 1))
    assert history[-1]["real_steps"] == out["real_steps"]
    assert not checkpoint_dir(paths, method).exists()  # finished: nothing left to resume


@pytest.mark.integration
def test_real_grpo_counts_real_steps_and_registers_the_policy(project, grpo_real) -> None:
    import mlflow

    from components.stages.agent import REGISTERED_MODEL

    cfg, paths = project
    g = cfg.rl.grpo
    assert grpo_real["iterations"] == g.iterations and grpo_real["synthetic_steps"] == 0
    episodes = g.iterations * g.tasks_per_iteration * g.rollouts_per_task
    assert 0 < grpo_real["real_steps"] <= episodes * cfg.env.max_steps
    _common_outputs(paths, "grpo_real", grpo_real, g.iterations)
    version = mlflow.MlflowClient().get_model_version_by_alias(REGISTERED_MODEL, "grpo_real")
    assert str(version.version) == grpo_real["registered_version"]
    assert version.tags["init"] == "sft"


@pytest.mark.integration
def test_dreamgym_trains_in_the_synthetic_env_and_grows_the_buffer(project, dreamgym_grpo) -> None:
    from components.buffer import SEED_TAG, ReplayBuffer
    from components.schema import Trajectory, read_jsonl
    from components.stages.data import load_tasks
    from components.stages.rl import coevolved_dir, synthetic_file

    cfg, paths = project
    out = dreamgym_grpo
    assert out["real_steps"] == 0 and out["synthetic_steps"] > 0
    _common_outputs(paths, "dreamgym_grpo", out, cfg.rl.grpo.iterations)
    trajs = list(read_jsonl(synthetic_file(paths, "grpo"), Trajectory))
    steps = [s for t in trajs for s in t.steps]
    assert len(steps) == out["synthetic_steps"] == out["buffer_rows_synthetic"]
    train_ids = {t.task_id for t in load_tasks(paths) if t.split == "train"}
    assert {t.source for t in trajs} == {"synthetic"} and {t.split for t in trajs} == {"train"}
    assert {t.task_id for t in trajs} <= train_ids  # no generated variant parsed: real tasks
    assert {s.provenance.iteration for s in steps} == set(range(cfg.rl.grpo.iterations))
    assert {s.provenance.policy for s in steps} == {"dreamgym_grpo"}

    seed = ReplayBuffer.open(paths.buffer, cfg.buffer, create=False)
    grown = ReplayBuffer.open(coevolved_dir(paths, "grpo"), cfg.buffer, create=False)
    assert seed.stats()["rows_synthetic"] == 0 and seed.tags().keys() == {SEED_TAG}
    assert grown.stats()["rows"] == seed.stats()["rows"] + len(steps)
    assert {"iter-0", "iter-1"} <= grown.tags().keys()
    grown.checkout("iter-0")  # round 0's version holds round 0's rows only
    assert grown.stats()["rows_synthetic"] == sum(s.provenance.iteration == 0 for s in steps)
    history = _history(paths, "dreamgym_grpo")
    assert all(h["real_steps"] == 0 for h in history)
    assert history[0]["curriculum.share_generated"] == 0.0  # round 0: real tasks only
    assert history[-1]["buffer.rows_synthetic"] == len(steps)


@pytest.mark.integration
def test_s2r_uses_exactly_its_share_of_the_real_runs_steps(project, grpo_real, dreamgym_grpo):
    from components.stages.rl import train_s2r

    cfg, paths = project
    cap = math.floor(cfg.rl.s2r_real_fraction * grpo_real["real_steps"])
    assert cap > 0
    out = train_s2r(cfg, paths, "grpo")
    assert out["real_steps"] == out["real_step_cap"] == cap  # cut mid-round, never over
    assert out["reference_real_steps"] == grpo_real["real_steps"]
    _common_outputs(paths, "s2r_grpo", out, out["iterations"])
    meta = json.loads((paths.root / "models/policy/s2r_grpo/policy.json").read_text())
    assert meta["init"] == "dreamgym_grpo" and meta["real_step_cap"] == cap


@pytest.mark.integration
def test_dreamgym_ppo_ablations_keep_the_buffer_and_the_tasks_real(project) -> None:
    from components.buffer import ReplayBuffer
    from components.config import AblationConfig
    from components.stages.rl import coevolved_dir, train_dreamgym

    cfg, paths = project
    ablated = cfg.model_copy(
        update={"ablation": AblationConfig(no_replay=True, no_task_generation=True)}
    )
    out = train_dreamgym(ablated, paths, "ppo")
    assert out["real_steps"] == 0 and out["synthetic_steps"] > 0
    assert out["coevolution"] == 0 and out["task_generation"] == 0
    grown = ReplayBuffer.open(coevolved_dir(paths, "ppo"), cfg.buffer, create=False)
    assert grown.stats()["rows_synthetic"] == 0 and "iter-0" not in grown.tags()
    history = _history(paths, "dreamgym_ppo")
    assert all(h["curriculum.share_generated"] == 0.0 for h in history)
