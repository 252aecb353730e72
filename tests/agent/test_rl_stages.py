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
from components.agent.rollout import collect_rollouts
from components.config import Config, Paths, load_config
from components.envs.vector import BUDGET_CUT, ENV_ERROR, CappedEnvList
from tests.agent.rl_env import MagicWordEnv, counted, magic_grpo, magic_task, probe_tasks

ROOT = Path(__file__).resolve().parents[2]


def test_one_vector_env_contract_tells_a_batch_from_a_single_env() -> None:
    from components.agent.train import as_vector_env
    from components.envs.vector import EnvList, VectorEnv

    envs = EnvList([MagicWordEnv()])
    assert isinstance(envs, VectorEnv) and not isinstance(MagicWordEnv(), VectorEnv)
    assert as_vector_env(envs) == (envs, False)  # the caller's: not closed by train_rl
    made, owned = as_vector_env(MagicWordEnv)  # a factory: a pool made (and closed) here
    assert isinstance(made, EnvList) and owned


def test_s2r_runs_get_their_own_rounds_and_aggregation() -> None:
    from components.artifacts import DREAMGYM, REAL, S2R
    from components.stages.rl_seed import algo_config

    cfg = load_config(ROOT / "params.yaml", profile="cpu")
    real, dream, s2r = (algo_config(cfg, "grpo", k, 1) for k in (REAL, DREAMGYM, S2R))
    assert real.aggregation == dream.aggregation == cfg.rl.grpo.aggregation
    assert s2r.aggregation == cfg.rl.s2r_aggregation == "episode"
    assert s2r.tasks_per_iteration == cfg.rl.s2r_tasks_per_iteration and s2r.seed == 1
    assert dream.iterations == cfg.rl.dreamgym_iterations
    assert dream.tasks_per_iteration == real.tasks_per_iteration  # null: the algorithm's own
    wide = cfg.model_copy(
        update={"rl": cfg.rl.model_copy(update={"dreamgym_tasks_per_iteration": 3})}
    )
    assert algo_config(wide, "grpo", DREAMGYM, 1).tasks_per_iteration == 3
    assert algo_config(wide, "grpo", REAL, 1).tasks_per_iteration == real.tasks_per_iteration


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


def test_synthetic_prior_seeds_the_sampler_with_dreamt_success(tmp_path: Path) -> None:
    from components.curriculum.sampling import VarianceTaskSampler
    from components.stages.rl_seed import synthetic_prior

    tasks = [magic_task(i) for i in range(3)]
    sampler = VarianceTaskSampler(tasks, seed=0)

    def row(task_id: str, success: bool, seed: int = 0) -> dict[str, Any]:
        prov = {"checkpoint": f"seed-{seed}/round-0"}
        return {"task_id": task_id, "steps": [{"provenance": prov}], "success": success}

    rows = [row("magic-0", True)] * 6 + [row("magic-1", s) for s in (False, True)]
    rows += [row("gen-x", True), row("magic-2", True, seed=1)]  # generated; another seed
    synthetic = tmp_path / "dreamgym_grpo.jsonl"  # written compact, as write_jsonl does
    synthetic.write_text(
        "".join(json.dumps(r, separators=(",", ":")) + "\n" for r in rows), encoding="utf-8"
    )
    assert synthetic_prior(sampler, synthetic, seed=0) == 2  # generated: not in the pool
    assert sampler.stats["magic-0"] == [4.0, 4.0]  # capped: real rounds overrule a dream
    assert sampler.stats["magic-1"] == [1.0, 2.0] and sampler.stats["magic-2"] == [0.0, 0.0]
    assert sampler.weight("magic-1") > sampler.weight("magic-0")  # uncertain: drawn more
    with pytest.raises(FileNotFoundError, match="train-dreamgym"):
        synthetic_prior(sampler, tmp_path / "missing.jsonl", seed=0)


# ----------------------------------------------------------------------------- stages


def _config(suite_cfg: Config) -> Config:
    cfg = load_config(ROOT / "params.yaml", profile="ci")
    return cfg.model_copy(update={"env": suite_cfg.env, "collect": suite_cfg.collect})


@pytest.fixture(scope="module")
def project(agent_tw_suite, tmp_path_factory) -> tuple[Config, Paths]:
    """A project with real tasks, real trajectories, the seed buffer, an SFT policy and the
    grounded experience model: what the RL stages read."""
    import torch

    from components.buffer import SEED_TAG, ReplayBuffer
    from components.data.collect import collect
    from components.schema import Trajectory, read_jsonl, write_jsonl
    from components.stages.agent import train_sft_baseline
    from components.stages.experience import train_experience_model

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
    train_experience_model(cfg, paths, "full")
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
    assert all("." not in k for row in as_plot for k in row)  # plain keys for DVC plots
    return as_plot


def _common_outputs(paths: Paths, method: str, out: dict[str, Any], rounds: int) -> None:
    from components.artifacts import policy_checkpoint_dir, policy_dir

    meta = json.loads((policy_dir(paths, method) / "seed-0" / "policy.json").read_text())
    assert meta["method"] == method and meta["real_steps"] == out["real_steps"]
    saved = json.loads((paths.metrics / "agent" / f"{method}.json").read_text())
    for key in ("real_steps", "wall_seconds", "success_rate_last", "optimizer_updates"):
        assert saved[key] == out[key]
    assert saved["optimizer_updates"] > 0  # learning happened: parameters were stepped
    assert saved["per_seed"]["0"]["real_steps"] == out["real_steps"]
    history = _history(paths, method)
    assert [h["iteration"] for h in history] == list(range(1, int(rounds) + 1))
    assert {h["seed"] for h in history} == {0}
    assert history[-1]["real_steps"] == out["real_steps"]
    assert not (policy_checkpoint_dir(paths, method) / "seed-0").exists()  # nothing left to resume


@pytest.mark.integration
def test_real_grpo_counts_real_steps_and_registers_the_policy(project, grpo_real) -> None:
    import mlflow

    from components.stages.agent import REGISTERED_MODEL

    cfg, paths = project
    g = cfg.rl.grpo
    assert grpo_real["iterations"] == g.iterations and grpo_real["seeds"] == 1
    episodes = g.iterations * g.tasks_per_iteration * g.rollouts_per_task
    assert 0 < grpo_real["real_steps"] <= episodes * cfg.env.max_steps
    _common_outputs(paths, "grpo_real", grpo_real, g.iterations)
    version = mlflow.MlflowClient().get_model_version_by_alias(REGISTERED_MODEL, "grpo_real")
    assert str(version.version) == grpo_real["registered_version"]
    assert version.tags["init"] == "sft"


@pytest.mark.integration
def test_both_algorithms_in_one_pool_train_as_they_do_alone(project, grpo_real, tmp_path) -> None:
    """The stage's default: GRPO's and PPO's seeds in one pool of worker processes give
    GRPO the very run it has alone in-process; one MLflow run per stage, one per algorithm
    nested in it, the seeds below."""
    import mlflow

    from components.stages.rl import train_rl_real
    from components.tracking import tracking_uri

    cfg, paths = project
    copy = Paths(tmp_path / "project")
    shutil.copytree(paths.root, copy.root)
    shutil.rmtree(copy.root / "models/policy/grpo_real")
    (copy.root / "mlflow.db").unlink()  # only this test's runs below
    shutil.rmtree(copy.mlruns, ignore_errors=True)
    cfg = cfg.model_copy(update={"agent": cfg.agent.model_copy(update={"workers": 2})})
    out = train_rl_real(cfg, copy)
    assert set(out) == {"grpo_real", "ppo_real"}

    def same(summary: dict[str, Any]) -> dict[str, Any]:  # all but the clock
        return {
            s: {k: v for k, v in m.items() if not k.endswith("_seconds")}
            for s, m in summary["per_seed"].items()
        }

    assert same(out["grpo_real"]) == same(grpo_real)
    assert out["ppo_real"]["optimizer_updates"] > 0
    for method in ("grpo_real", "ppo_real"):
        saved = json.loads((copy.metrics / "agent" / f"{method}.json").read_text())
        assert same(saved) == same(out[method])
        assert (copy.root / "models/policy" / method / "seed-0" / "policy.json").is_file()

    mlflow.set_tracking_uri(tracking_uri(copy.root))
    runs = {
        r.info.run_name: r
        for r in mlflow.search_runs(search_all_experiments=True, output_format="list")
    }
    stage = runs["train_rl_real"]
    assert stage.data.tags["stage"] == "train_rl_real"
    for algo in ("grpo", "ppo"):
        run = runs[f"train_rl_real@{algo}"]
        assert run.data.tags["mlflow.parentRunId"] == stage.info.run_id
        assert "stage" not in run.data.tags  # bench.stages times the stage once
        seed = runs[f"train_rl_real@{algo}/seed-0"]
        assert seed.data.tags["mlflow.parentRunId"] == run.info.run_id


@pytest.mark.integration
def test_dreamgym_trains_in_the_synthetic_env_and_grows_the_buffer(project, dreamgym_grpo) -> None:
    from components.artifacts import coevolved_dir, synthetic_file
    from components.buffer import SEED_TAG, ReplayBuffer
    from components.experience.task_generation import GENERATED_PREFIX
    from components.schema import Trajectory, read_jsonl
    from components.stages.data import load_tasks

    cfg, paths = project
    out = dreamgym_grpo
    rounds = cfg.rl.dreamgym_iterations
    assert out["real_steps"] == 0 and out["synthetic_steps"] > 0
    _common_outputs(paths, "dreamgym_grpo", out, rounds)
    trajs = list(read_jsonl(synthetic_file(paths, "grpo"), Trajectory))
    steps = [s for t in trajs for s in t.steps]
    assert len(steps) == out["synthetic_steps"] == out["buffer_rows_synthetic"]
    tasks = load_tasks(paths)
    train_ids = {t.task_id for t in tasks if t.split == "train"}
    held_out = {t.task_id for t in tasks if t.split != "train"}
    assert {t.source for t in trajs} == {"synthetic"} and {t.split for t in trajs} == {"train"}
    played = {t.task_id for t in trajs}
    assert played & train_ids and not played & held_out  # real train tasks and variants only
    assert all(i in train_ids or i.startswith(GENERATED_PREFIX) for i in played)
    assert {s.provenance.iteration for s in steps} == set(range(rounds))
    assert {s.provenance.policy for s in steps} == {"dreamgym_grpo"}
    # the synthetic env has the real env's contract: admissible commands at every step
    assert all(s.admissible_actions for s in steps)

    seed = ReplayBuffer.open(paths.buffer, cfg.buffer, create=False)
    grown = ReplayBuffer.open(coevolved_dir(paths, "grpo", 0), cfg.buffer, create=False)
    assert seed.stats()["rows_synthetic"] == 0 and seed.tags().keys() == {SEED_TAG}
    assert grown.stats()["rows"] == seed.stats()["rows"] + len(steps)
    assert {"iter-0", "iter-1"} <= grown.tags().keys()
    grown.checkout("iter-0")  # round 0's version holds round 0's rows only
    assert grown.stats()["rows_synthetic"] == sum(s.provenance.iteration == 0 for s in steps)
    history = _history(paths, "dreamgym_grpo")
    assert all(h["real_steps"] == 0 for h in history)
    assert history[0]["curriculum_share_generated"] == 0.0  # round 0: real tasks only
    assert history[-1]["buffer_rows_synthetic"] == len(steps)
    for key in ("success_rate", "reward_std", "optimizer_steps", "policy_kl", "train_seconds"):
        assert all(key in h for h in history), key  # per round: reward, variance, updates, KL


@pytest.mark.integration
@pytest.mark.parametrize("snapshots", [True, False])
def test_keeping_snapshots_is_part_of_a_dreamgym_runs_identity(project, snapshots, monkeypatch):
    """Switched on between a kill and a resume, the resumed run would lack the rounds
    before it: a run that keeps them is another run."""
    from components.agent import train
    from components.artifacts import DREAMGYM
    from components.stages import rl_seed as rl

    cfg, paths = project
    cfg = cfg.model_copy(
        update={"theorem1": cfg.theorem1.model_copy(update={"snapshots": snapshots})}
    )
    stamped: list[dict] = []

    class Stop(Exception):
        pass

    def capture(*args: Any, **kw: Any) -> Any:
        stamped.append(dict(kw["fingerprint"]))
        raise Stop

    monkeypatch.setattr(train, "train_rl", capture)
    with pytest.raises(Stop):
        rl.rl_seed(cfg, paths, "grpo", DREAMGYM, 0)
    assert stamped[0].get("snapshots", False) is snapshots


@pytest.mark.integration
def test_dreamgym_logs_round_curves_and_its_datasets_to_mlflow(project, dreamgym_grpo) -> None:
    """Per-round curves with step= in the seed's run; tasks, trajectories, synthetic
    trajectories and the co-evolved buffer as the stage run's MLflow datasets."""
    import mlflow

    from components.tracking import tracking_uri

    cfg, paths = project
    mlflow.set_tracking_uri(tracking_uri(paths.root))
    client = mlflow.MlflowClient()

    def run_named(name: str) -> Any:
        runs = mlflow.search_runs(
            search_all_experiments=True,
            filter_string=f"attributes.run_name = '{name}'",
            output_format="list",
        )
        return max(runs, key=lambda r: r.info.start_time)

    seed_run = run_named("train_dreamgym@grpo/seed-0")
    rounds = list(range(1, cfg.rl.dreamgym_iterations + 1))
    for key in ("success_rate", "mean_reward", "policy_kl", "policy_loss", "lr"):
        steps = [m.step for m in client.get_metric_history(seed_run.info.run_id, key)]
        assert steps == rounds, key
    lr = client.get_metric_history(seed_run.info.run_id, "lr")
    assert {m.value for m in lr} == {cfg.rl.grpo.learning_rate}
    inputs = run_named("train_dreamgym@grpo").inputs.dataset_inputs
    contexts = {i.dataset.name: {t.key: t.value for t in i.tags} for i in inputs}
    assert {"tasks", "trajectories", "synthetic-trajectories", "buffer-seed-0"} <= set(contexts)
    assert contexts["synthetic-trajectories"]["mlflow.data.context"] == "synthetic"


@pytest.mark.integration
@pytest.mark.parametrize("mode", ["reground", "real_rl"])
def test_s2r_stays_within_its_share_of_the_real_runs_steps(
    project, grpo_real, dreamgym_grpo, mode, monkeypatch
):
    from components.agent import train
    from components.artifacts import synthetic_file
    from components.stages import rl_seed as rl
    from components.stages.rl import train_s2r
    from components.tracking import dvc_md5

    cfg, paths = project
    update = {"s2r_mode": mode, "s2r_task_prior": "synthetic"}
    cfg = cfg.model_copy(update={"rl": cfg.rl.model_copy(update=update)})
    cap = math.floor(cfg.rl.s2r_real_fraction * grpo_real["real_steps"])
    assert cap > 0
    dreamt = dvc_md5(synthetic_file(paths, "grpo"))
    # a resume must check the fingerprint train_rl stamps: a partial one wipes checkpoints
    checked, stamped = [], []
    resume_point, train_rl = rl._resume_point, train.train_rl
    monkeypatch.setattr(
        rl, "_resume_point", lambda d, c, fp: checked.append(dict(fp)) or resume_point(d, c, fp)
    )
    monkeypatch.setattr(
        train,
        "train_rl",
        lambda *a, **kw: stamped.append(dict(kw["fingerprint"])) or train_rl(*a, **kw),
    )
    out = train_s2r(cfg, paths, "grpo")
    assert checked and checked == stamped
    assert ("task_prior" in stamped[0]) == (mode == "real_rl")
    assert 0 < out["real_steps"] <= out["real_step_cap"] == cap  # cut mid-round, never over
    assert out["reference_real_steps"] == grpo_real["real_steps"]
    _common_outputs(paths, "s2r_grpo", out, out["iterations"])
    meta = json.loads((paths.root / "models/policy/s2r_grpo/seed-0/policy.json").read_text())
    assert meta["init"] == "dreamgym_grpo" and meta["real_step_cap"] == cap
    if mode == "reground":  # real probes, then RL in the re-grounded dream only
        assert out["probe_real_steps"] == out["real_steps"] and out["probe_episodes"] > 0
        assert out["iterations"] == cfg.rl.dreamgym_iterations and out["synthetic_steps"] > 0
    assert dvc_md5(synthetic_file(paths, "grpo")) == dreamt  # DreamGym's outputs untouched


def test_probes_are_real_capped_and_reused_on_resume(magic_policy, tmp_path: Path) -> None:
    from components.stages.regrounding import probe_rollouts

    stepped: list[str] = []
    Counted = counted(stepped)
    tasks = probe_tasks()
    kw = {"cap": 7, "batch_size": 2, "seed": 0, "out_dir": tmp_path}
    cfg = magic_grpo()
    probes, steps = probe_rollouts(magic_policy, lambda: Counted(max_steps=3), tasks, cfg, **kw)
    assert steps == 7 == len(stepped)  # exactly the cap, never over
    assert probes and all(t.source == "real" and t.policy == "s2r-probe" for t in probes)
    assert sum(len(t.steps) for t in probes) <= steps  # an episode the cap cut is dropped
    again = probe_rollouts(magic_policy, lambda: Counted(max_steps=3), tasks, cfg, **kw)
    assert again == (probes, steps) and len(stepped) == 7  # resumed: no real step spent again
    kw.update(cap=100, out_dir=tmp_path / "one-pass")
    once, _ = probe_rollouts(magic_policy, Counted, tasks, cfg, passes=1, **kw)
    assert sorted(t.task_id for t in once) == sorted(t.task_id for t in tasks)  # one each


@pytest.mark.integration
def test_walks_explore_real_exits_no_recorded_episode_took(project, tmp_path: Path) -> None:
    from components.envs import env_factory
    from components.stages.exploration import EXPLORE_POLICY, explore_rollouts, known_maps
    from components.stages.regrounding import offline_train
    from components.stages.rl_seed import _train_tasks

    cfg, paths = project
    tasks = _train_tasks(paths)
    unknown = {t: len(m.frontier()) for t, m in known_maps(offline_train(paths)).items()}
    assert sum(unknown.values()) > 0  # expert demos leave exits unwalked
    maps = known_maps(offline_train(paths))
    kw = {"cap": 12, "max_steps": cfg.env.max_steps, "seed": 0, "out_dir": tmp_path}
    walks, steps = explore_rollouts(maps, env_factory(cfg.env, paths.root), tasks, **kw)
    assert 0 < steps <= 12 and sum(len(w.steps) for w in walks) == steps  # every step kept
    assert all(w.source == "real" and w.policy == EXPLORE_POLICY for w in walks)
    assert {s.action.split()[0] for w in walks for s in w.steps} == {"go"}
    # a walk the step limit ends is truncated: the grounded model must not learn a loss
    assert all(w.truncated or not w.steps[-1].done for w in walks)
    after = {t: len(m.frontier()) for t, m in known_maps([*offline_train(paths), *walks]).items()}
    assert sum(after.values()) < sum(unknown.values())  # the walks filled in the map

    def no_env() -> Any:
        raise AssertionError("a resumed exploration stepped a real env")

    assert explore_rollouts(maps, no_env, tasks, **kw) == (walks, steps)  # reused


@pytest.mark.integration
def test_dreamgym_ppo_ablations_keep_the_buffer_and_the_tasks_real(project) -> None:
    from components.artifacts import coevolved_dir
    from components.buffer import ReplayBuffer
    from components.config import AblationConfig
    from components.stages.rl import train_dreamgym

    cfg, paths = project
    ablated = cfg.model_copy(
        update={"ablation": AblationConfig(no_replay=True, no_task_generation=True)}
    )
    out = train_dreamgym(ablated, paths, "ppo")
    assert out["real_steps"] == 0 and out["synthetic_steps"] > 0
    assert out["coevolution"] == 0 and out["task_generation"] == 0
    assert not any(coevolved_dir(paths, "ppo", 0).iterdir())  # no buffer grew
    seed = ReplayBuffer.open(paths.buffer, cfg.buffer, create=False)
    assert seed.stats()["rows_synthetic"] == 0 and "iter-0" not in seed.tags()
    history = _history(paths, "dreamgym_ppo")
    assert all(h["curriculum_share_generated"] == 0.0 for h in history)


class _PartialScoreEnv(MagicWordEnv):
    """env.reward = score: every step pays a partial score; only the target word wins."""

    def step(self, action: str) -> tuple[str, Any, bool, bool, dict[str, Any]]:
        obs, _, terminated, truncated, info = super().step(action)
        return obs, 0.5, terminated, truncated, info


def test_a_partial_score_is_a_reward_but_not_a_win(magic_policy) -> None:
    from components.agent.evaluate import apply_answer, start_episode
    from components.envs.vector import EnvList

    task = magic_task(target="never-said")  # the policy only says WORDS: it never wins
    batch = collect_rollouts(
        magic_policy, EnvList([_PartialScoreEnv(max_steps=2)]), [task], max_new_tokens=12
    )
    episode = batch.episodes[0]
    assert episode.reward == 1.0 and not episode.success  # 2 x 0.5 of score, no win
    trajectory = episode.to_trajectory(source="synthetic", policy="p")
    assert trajectory is not None and not trajectory.success
    assert [s.reward for s in trajectory.steps] == [0, 0]  # transitions record wins only
    live = start_episode(task, 0, _PartialScoreEnv(max_steps=1))
    record = apply_answer(live, type("A", (), {"action": "please", "malformed": False})())
    assert record is not None and not record.success


@pytest.mark.integration
def test_transfer_evaluates_zero_shot_and_after_capped_s2r(project, grpo_real, dreamgym_grpo):
    from components.stages.agent import evaluate_policy
    from components.stages.transfer import transfer

    cfg, paths = project
    for method in ("random", "dreamgym_grpo"):  # the in-domain rows it is paired with
        evaluate_policy(cfg, paths, method)
    out = paths.root / "transfer.json"
    out.write_text(json.dumps({"scienceworld->textworld": {"kept": True}}))
    result = transfer(cfg, paths, paths.root, "grpo", out)
    saved = json.loads(out.read_text())
    assert saved["scienceworld->textworld"] == {"kept": True}  # other directions stay
    entry = saved["textworld->textworld"]
    assert entry == json.loads(json.dumps(result["textworld->textworld"]))
    zero, s2r = entry["zero_shot"], entry["s2r"]
    rows = (paths.data / "transfer" / "textworld-textworld" / "zero_shot.jsonl").read_text()
    assert zero["episodes"] == len(rows.splitlines()) > 0
    assert {"vs_random", "vs_in_domain_dreamgym"} <= set(zero)
    # the same policy on the same tasks and seeds as its in-domain evaluation: no difference
    assert zero["vs_in_domain_dreamgym"]["diff"] == 0.0
    assert entry["in_domain"]["dreamgym_grpo"]["success"] == zero["success"]
    cap = math.floor(cfg.rl.s2r_real_fraction * grpo_real["real_steps"])
    trained = entry["s2r_training"]["per_seed"]["0"]
    assert 0 < trained["real_steps"] <= cap and trained["optimizer_updates"] > 0
    assert entry["s2r_training"]["reward"] == cfg.env.reward  # no --reward: the project's
    assert s2r["episodes"] == zero["episodes"]
    meta = json.loads(
        (
            paths.root / "models/policy/transfer_s2r_grpo_from_textworld/seed-0/policy.json"
        ).read_text()
    )
    assert meta["init"].endswith("models/policy/dreamgym_grpo/seed-0")
    assert entry["_provenance"]["source_project"] == str(paths.root)
    out.write_text("{not json")
    with pytest.raises(ValueError, match="not valid JSON"):
        transfer(cfg, paths, paths.root, "grpo", out)
    assert out.read_text() == "{not json"


@pytest.mark.integration
def test_a_transfer_seed_without_an_update_keeps_its_start_in_the_s2r_row(
    project, dreamgym_grpo, monkeypatch, tmp_path: Path
):
    # the S2R row must cover every seed: one that could not learn plays as its start
    # (its zero-shot episodes), and the real steps it spent count
    from components.stages import rl_seed as rl
    from components.stages.transfer import transfer

    def no_update(*args, **kwargs):
        raise rl.NoUpdateError("seed 0: no optimizer update", real_steps=7)

    monkeypatch.setattr(rl, "rl_seed", no_update)
    cfg, paths = project
    entry = transfer(cfg, paths, paths.root, "grpo", tmp_path / "t.json")["textworld->textworld"]
    zero, s2r, trained = entry["zero_shot"], entry["s2r"], entry["s2r_training"]
    assert s2r["episodes"] == zero["episodes"] > 0 and s2r["success"] == zero["success"]
    assert trained["seeds_without_update"] == {"0": "seed 0: no optimizer update"}
    assert trained["real_steps"] == 7 and trained["per_seed"] == {}


def test_transfer_s2r_reward_is_checked_against_the_target_env() -> None:
    from components.stages.transfer import s2r_reward

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    assert s2r_reward(cfg, None) == cfg.env.reward
    assert s2r_reward(cfg, "score") == "score"  # textworld keeps a score
    with pytest.raises(ValueError, match="expected one of"):
        s2r_reward(cfg, "points")
    pages = cfg.model_copy(update={"env": cfg.env.model_copy(update={"name": "miniwob"})})
    with pytest.raises(ValueError, match="miniwob keeps no score"):
        s2r_reward(pages, "score")


def test_transfer_needs_the_source_policies(tmp_path: Path) -> None:
    from components.stages.transfer import transfer

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    with pytest.raises(FileNotFoundError, match=r"is .* a project"):
        transfer(cfg, Paths(tmp_path / "target"), tmp_path / "nothing", "grpo")


class _Killed(Exception):
    """Stands for a kill -9 between a round's bookkeeping and its checkpoint."""


def _dreamgym_seed(cfg: Config, paths: Paths, monkeypatch, kill_after: int | None) -> Any:
    """rl_seed(dreamgym, grpo, seed 0) in-process; (its result, its DreamGymRun), or
    (None, run) when killed right after round ``kill_after``'s bookkeeping."""
    from components.artifacts import DREAMGYM
    from components.stages import dreamgym
    from components.stages.rl_seed import rl_seed

    seen: dict[str, Any] = {}
    on_rollouts = dreamgym.DreamGymRun.on_rollouts

    def hooked(self: Any, iteration: int, batch: Any) -> dict[str, float]:
        seen["run"] = self
        if self.buffer is not None:  # what the round's dream could retrieve: the past only
            rows = self.buffer.transitions()
            assert all(s.provenance.iteration < iteration for s in rows if s.source != "real")
        metrics = on_rollouts(self, iteration, batch)
        if iteration == kill_after:
            raise _Killed
        return metrics

    with monkeypatch.context() as m:
        m.setattr(dreamgym.DreamGymRun, "on_rollouts", hooked)
        try:
            out = rl_seed(cfg, paths, "grpo", DREAMGYM, 0)
        except _Killed:
            out = None
    return out, seen["run"]


def _dreamgym_outputs(cfg: Config, paths: Paths, out: dict[str, Any], run: Any) -> dict[str, Any]:
    """What an uninterrupted and a resumed run must agree on (all but clocks and versions)."""
    from components.artifacts import coevolved_dir, policy_dir, synthetic_file
    from components.buffer import ReplayBuffer
    from components.schema import Trajectory, read_jsonl

    def steady(row: dict[str, Any]) -> dict[str, Any]:
        skip = ("seconds", "steps_per_s", "version", "wall")
        return {k: v for k, v in row.items() if not any(s in k for s in skip)}

    rows = []
    if not cfg.ablation.no_replay:
        buffer = ReplayBuffer.open(coevolved_dir(paths, "grpo", 0), cfg.buffer, create=False)
        rows = buffer.transitions()
    weights = {
        str(f.relative_to(root)): f.read_bytes()
        for root in [policy_dir(paths, "dreamgym_grpo", 0)]
        for f in sorted(root.rglob("*"))
        if f.is_file() and f.name != "policy.json"
    }
    return {
        "trajectories": [
            t.model_dump(mode="json")
            for t in read_jsonl(synthetic_file(paths, "grpo", 0), Trajectory)
        ],
        "buffer_ids": sorted(s.id for s in rows),
        "buffer_rows": len(rows),
        "history": [steady(h) for h in out["history"]],
        "summary": steady({k: v for k, v in out.items() if k not in ("history", "resumed")}),
        "remembered": {k: dict(v) for k, v in run.model.synthetic.items()},
        "weights": weights,
    }


@pytest.mark.integration
@pytest.mark.parametrize("case", ["coevolving", "no_replay", "work_buffer_lost"])
def test_a_killed_dreamgym_run_resumes_into_the_uninterrupted_runs_outputs(
    project, tmp_path, monkeypatch, case
) -> None:
    """Killed after round 2's bookkeeping (its trajectories saved, appended to the work
    buffer, remembered) but before its checkpoint, then rerun: the resumed run redoes
    round 2 and its outputs equal an uninterrupted run's (ids, buffer rows and metrics,
    the grounded model's remembered dreams, the weights): nothing of the killed round
    leaks into the redone one. Also without co-evolution (nothing remembered then), and
    when the work buffer was lost (forked again, the saved rounds appended again)."""
    from components.artifacts import policy_checkpoint_dir
    from components.stages.dreamgym import WORK_BUFFER_DIR

    cfg, paths = project
    assert cfg.rl.dreamgym_iterations == 3 and cfg.rl.grpo.save_every == 1
    ablation = cfg.ablation.model_copy(update={"no_replay": case == "no_replay"})
    cfg = cfg.model_copy(update={"ablation": ablation})
    straight, resumed = Paths(tmp_path / "straight"), Paths(tmp_path / "resumed")
    for copy in (straight, resumed):
        shutil.copytree(paths.root, copy.root)
    out, run = _dreamgym_seed(cfg, straight, monkeypatch, kill_after=None)
    want = _dreamgym_outputs(cfg, straight, out, run)

    killed, _ = _dreamgym_seed(cfg, resumed, monkeypatch, kill_after=2)
    assert killed is None
    if case == "work_buffer_lost":
        shutil.rmtree(policy_checkpoint_dir(resumed, "dreamgym_grpo", 0) / WORK_BUFFER_DIR)
    out, run = _dreamgym_seed(cfg, resumed, monkeypatch, kill_after=None)
    assert out["resumed"] == 1
    got = _dreamgym_outputs(cfg, resumed, out, run)
    assert got["buffer_rows"] == len(set(got["buffer_ids"]))
    assert [k for k in want if got[k] != want[k]] == []
