"""Config: profiles overlay the defaults; unknown keys and bad values name the key."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from components.config import ConfigError, load_config

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


def test_wrong_type_and_unknown_profile(tmp_path: Path):
    path = _write(tmp_path, lambda r: r["env"].update(max_steps="many"))
    with pytest.raises(ConfigError, match=r"env\.max_steps"):
        load_config(path)
    with pytest.raises(ConfigError, match="unknown profile 'laptop'"):
        load_config(ROOT / "params.yaml", profile="laptop")


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
        if key == "profiles":
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
