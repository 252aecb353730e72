"""Config: profiles overlay the defaults; unknown keys and bad values name the key."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel, TypeAdapter, ValidationError
from pydantic_core import to_jsonable_python

from components.config import Config, ConfigError, load_config

ROOT = Path(__file__).resolve().parents[2]


def _write(tmp_path: Path, mutate) -> Path:
    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    mutate(raw)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    return path


def test_default_profile_is_cpu_and_overlays_apply():
    cpu = load_config(ROOT / "params.yaml")
    ci = load_config(ROOT / "params.yaml", profile="ci")
    assert cpu.profile == "cpu" and ci.profile == "ci"
    assert sum(f.n_games for f in ci.tasks.families) < sum(f.n_games for f in cpu.tasks.families)
    # sections the overlay does not mention keep their defaults
    assert ci.ingest == cpu.ingest
    assert ci.collect.epsilon == cpu.collect.epsilon
    assert ci.collect.episodes != cpu.collect.episodes


def test_env_overrides_apply_to_their_env_only_and_the_profile_wins(tmp_path: Path):
    def mutate(raw: dict) -> None:
        raw["env_overrides"] = {"scienceworld": {"collect": {"demo_games": 7, "epsilon": 0.5}}}
        raw["profiles"]["ci"]["collect"]["demo_games"] = 3

    path = _write(tmp_path, mutate)
    assert load_config(path).collect.demo_games == 20  # textworld: untouched
    raw = yaml.safe_load(path.read_text())
    raw["env"]["name"] = "scienceworld"
    path.write_text(yaml.safe_dump(raw))
    sw = load_config(path)
    assert (sw.collect.demo_games, sw.collect.epsilon) == (7, 0.5)
    assert load_config(path, profile="ci").collect.demo_games == 3  # the profile goes on top
    assert load_config(path, profile="ci").collect.epsilon == 0.5


def test_every_env_has_an_overrides_entry_that_dvc_can_track():
    # every stage of dvc.yaml tracks env_overrides.${env.name}: a missing entry fails
    # `dvc exp run -S env.name=<env>` before any stage runs
    from components.config.data import ENV_NAMES

    raw = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert set(raw["env_overrides"]) == set(ENV_NAMES)
    assert "env_overrides.${env.name}" in (ROOT / "dvc.yaml").read_text()


def test_env_overrides_of_an_unknown_env_is_an_error(tmp_path: Path):
    path = _write(tmp_path, lambda raw: raw.update(env_overrides={"sciencewrld": {}}))
    with pytest.raises(ConfigError, match="unknown env"):
        load_config(path)


def test_config_is_frozen():
    cfg = load_config(ROOT / "params.yaml")
    with pytest.raises(ValidationError):
        cfg.collect.epsilon = 0.9  # type: ignore[misc]


def test_unknown_key_is_an_error_naming_the_key(tmp_path: Path):
    path = _write(tmp_path, lambda r: r["collect"].update(epsilom=0.2))
    with pytest.raises(ConfigError, match=r"collect\.epsilom: unknown key"):
        load_config(path)


def test_typo_in_an_inactive_profile_is_caught(tmp_path: Path):
    path = _write(tmp_path, lambda r: r["profiles"]["gpu"].update(colect={"workers": 8}))
    with pytest.raises(ConfigError, match=r"profile 'gpu'.*colect: unknown key"):
        load_config(path)


def test_typo_in_an_inactive_envs_overrides_is_caught(tmp_path: Path):
    # found only once `dvc exp run -S env.name=scienceworld` had started, before
    def typo(raw: dict[str, Any]) -> None:
        raw["env_overrides"]["scienceworld"]["rl"]["s2r_task_priorr"] = "synthetic"

    with pytest.raises(ConfigError, match=r"env_overrides\.scienceworld.*s2r_task_priorr"):
        load_config(_write(tmp_path, typo))
    # what the entry does not set is judged for the active env only: a score reward is
    # TextWorld's and ScienceWorld's, never MiniWoB++'s, yet a TextWorld project may use it
    score = load_config(_write(tmp_path, lambda r: r["env"].update(reward="score")))
    assert score.env.reward == "score"


def test_wrong_type_and_unknown_profile(tmp_path: Path):
    path = _write(tmp_path, lambda r: r["env"].update(max_steps="many"))
    with pytest.raises(ConfigError, match=r"env\.max_steps"):
        load_config(path)
    with pytest.raises(ConfigError, match="unknown profile 'laptop'"):
        load_config(ROOT / "params.yaml", profile="laptop")


def test_a_bool_is_not_read_as_a_number(tmp_path: Path):
    # lax pydantic reads `max_steps: true` as 1 and `lr: false` as 0.0: a typo that runs
    path = _write(tmp_path, lambda r: r["env"].update(max_steps=True))
    with pytest.raises(ConfigError, match=r"env\.max_steps: .*not true"):
        load_config(path)
    path = _write(tmp_path, lambda r: r["experience"].update(learning_rate=False))
    with pytest.raises(ConfigError, match=r"experience\.learning_rate: .*not false"):
        load_config(path)


def test_a_negative_seed_or_zero_rl_rounds_is_refused_where_it_is_written(tmp_path: Path):
    # numpy's generators raise on one, deep inside a stage, after the earlier stages ran
    path = _write(tmp_path, lambda r: r.update(seed=-1))
    with pytest.raises(ConfigError, match=r"seed: Input should be greater than or equal to 0"):
        load_config(path)
    path = _write(tmp_path, lambda r: r["rl"]["grpo"].update(iterations=0))  # no update ever
    with pytest.raises(ConfigError, match=r"rl\.grpo\.iterations: .*greater than or equal to 1"):
        load_config(path)
    path = _write(tmp_path, lambda r: r["agent"].update(seeds=[0, -2]))
    with pytest.raises(ConfigError, match=r"agent\.seeds\.1: .*greater than or equal to 0"):
        load_config(path)


def test_split_must_leave_a_test_split(tmp_path: Path):
    path = _write(tmp_path, lambda r: r["tasks"].update(split={"train": 0.8, "validation": 0.2}))
    with pytest.raises(ConfigError, match="held-out test split"):
        load_config(path)


def test_ablation_switches_default_to_the_full_method():
    cfg = load_config(ROOT / "params.yaml")
    assert not any(cfg.ablation.model_dump().values())


def test_each_method_trains_its_algorithms_seeds(tmp_path: Path):
    path = _write(tmp_path, lambda r: r["rl"]["ppo"].update(seeds=[0]))
    cfg = load_config(path)
    assert cfg.seeds_of("ppo_real") == cfg.seeds_of("dreamgym_ppo") == cfg.seeds_of("s2r_ppo")
    assert cfg.seeds_of("s2r_ppo") == [0] != list(cfg.agent.seeds)
    assert cfg.seeds_of("grpo_real") == cfg.seeds_of("sft") == list(cfg.agent.seeds)
    bad = _write(tmp_path, lambda r: r["rl"]["grpo"].update(seeds=[7]))
    with pytest.raises(ConfigError, match=r"rl.grpo.seeds \[7\] are not in agent.seeds"):
        load_config(bad)


def _leaf_keys(data: dict, prefix: tuple = ()) -> list[tuple]:
    out: list[tuple] = []
    for key, value in data.items():
        if key in ("profiles", "env_overrides"):
            continue
        if isinstance(value, dict) and value:
            out += _leaf_keys(value, (*prefix, key))
        else:
            out.append((*prefix, key))
    return out


def test_every_params_key_is_read_somewhere():
    """A key of params.yaml that no code outside the config classes names is a knob that
    silently does nothing (attribute access, a string key or a keyword argument count)."""
    import re

    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    code = "\n".join(
        p.read_text(encoding="utf-8")
        for folder in ("components", "flows", "bench")
        for p in sorted((ROOT / folder).rglob("*.py"))
        if "config" not in p.relative_to(ROOT).parts
    )
    unread = [
        ".".join(leaf)
        for leaf in _leaf_keys(params)
        if not re.search(rf"\.{leaf[-1]}\b|[\"']{leaf[-1]}[\"']|\b{leaf[-1]}=", code)
    ]
    assert not unread, f"params keys nothing reads: {unread}"


# Fields with no default: params.yaml must give them (the cpu profile's values live there).
REQUIRED_FIELDS = {"profile", "tasks.families", "collect.episodes"}


def _default_disagreements(model: type[BaseModel], params: dict, prefix: str = "") -> list[str]:
    """Every field of ``model`` (recursively) whose default differs from params.yaml."""
    out: list[str] = []
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = field.annotation
        if field.is_required():
            if isinstance(sub, type) and issubclass(sub, BaseModel):
                out += _default_disagreements(sub, params.get(name) or {}, f"{key}.")
            elif key not in REQUIRED_FIELDS:
                out.append(f"{key}: required, but not in REQUIRED_FIELDS")
            continue
        if name not in params:
            continue  # params.yaml leaves it to the default
        default = to_jsonable_python(field.get_default(call_default_factory=True))
        expected = to_jsonable_python(TypeAdapter(sub).validate_python(params[name]))
        out += _diff(default, expected, key)
    return out


def _diff(default: Any, expected: Any, key: str) -> list[str]:
    if (
        isinstance(default, dict)
        and isinstance(expected, dict)
        and default.keys() == expected.keys()
    ):
        return [d for k in default for d in _diff(default[k], expected[k], f"{key}.{k}")]
    return [] if default == expected else [f"{key}: class default {default!r}, params {expected!r}"]


def test_config_class_defaults_equal_params_yaml():
    """params.yaml's top-level values (the cpu profile) are the source of truth: a config
    built in code without params.yaml gets the same settings as the pipeline."""
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params.pop("profiles")
    params.pop("env_overrides")
    assert not _default_disagreements(Config, params)
    for key in REQUIRED_FIELDS:  # each required field is given by params.yaml
        node = params
        for part in key.split("."):
            node = node[part]
        assert node is not None, key


def test_the_defaults_check_catches_a_disagreement():
    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
    params.pop("profiles")
    params.pop("env_overrides")
    params["rl"]["ppo"]["gamma"] = 0.5
    params["env"]["miniwob"]["seeds"]["test"] = 9
    assert _default_disagreements(Config, params) == [
        "env.miniwob.seeds.test: class default 4, params 9",
        "rl.ppo.gamma: class default 0.99, params 0.5",
    ]


def test_sft_coef_needs_the_scorer_policy_and_gpu_on_scienceworld_loads(tmp_path: Path):
    # env_overrides.scienceworld sets rl.grpo.sft_coef 1.0; the gpu profile's LM policy has
    # no behaviour-cloning term: RL failed at its start with a ValueError traceback
    path = _write(
        tmp_path, lambda r: r.update(profile="gpu") or r["env"].update(name="scienceworld")
    )
    cfg = load_config(path)
    assert (cfg.agent.policy, cfg.rl.grpo.sft_coef, cfg.rl.ppo.sft_coef) == ("lm", 0.0, 0.0)
    path = _write(
        tmp_path,
        lambda r: r["agent"].update(policy="lm") or r["env"].update(name="scienceworld"),
    )
    with pytest.raises(ConfigError, match=r"rl\.grpo\.sft_coef 1\.0 > 0 needs agent\.policy"):
        load_config(path)


def test_a_top_level_lm_policy_is_not_refused_for_another_envs_sft_coef(tmp_path: Path):
    # scienceworld's override sets sft_coef 1.0: a user choosing the LM policy on textworld
    # was refused for an env it does not run (the rule is checked when that env is active)
    path = _write(tmp_path, lambda r: r["agent"].update(policy="lm"))
    assert load_config(path).agent.policy == "lm"


def test_policy_fidelity_cannot_play_the_random_baseline(tmp_path: Path):
    path = _write(tmp_path, lambda r: r["policy_fidelity"].update(methods=["sft", "random"]))
    with pytest.raises(ConfigError, match="random has no trained policy"):
        load_config(path)


def test_sentence_transformers_embedder_needs_a_model_name(tmp_path: Path):
    path = _write(tmp_path, lambda r: r["buffer"].update(embedder="sentence-transformers"))
    with pytest.raises(ConfigError, match=r"buffer: Value error, embedder sentence-transformers"):
        load_config(path)
    named = _write(
        tmp_path,
        lambda r: r["buffer"].update(embedder="sentence-transformers", model_name="some/model"),
    )
    assert load_config(named).buffer.model_name == "some/model"


def test_a_drift_stat_test_typo_is_refused_at_load(tmp_path: Path):
    # Evidently raised StatTestNotFoundError in the drift stage, after the pipeline ran
    path = _write(tmp_path, lambda r: r["drift"].update(num_method="kss"))
    with pytest.raises(ConfigError, match=r"drift\.num_method: .*'kss' is no Evidently.*'ks'"):
        load_config(path)
    path = _write(tmp_path, lambda r: r["drift"].update(cat_method="ks"))  # numerical only
    with pytest.raises(ConfigError, match=r"drift\.cat_method: .*categorical columns"):
        load_config(path)
    path = _write(tmp_path, lambda r: r["drift"].update(num_method="wasserstein", cat_method="psi"))
    assert load_config(path).drift.cat_method == "psi"


def test_the_gpu_profile_collects_no_exploration_episode():
    # its episodes mapping is merged key by key over the defaults' (explore: 2)
    gpu = load_config(ROOT / "params.yaml", profile="gpu")
    assert gpu.collect.episodes.get("explore", 0) == 0
    assert {k: v for k, v in gpu.collect.episodes.items() if v} == {
        "expert": 1,
        "noisy": 6,
        "random": 2,
    }
