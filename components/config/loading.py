"""The ``Config`` root, ``Paths``, and loading params.yaml with its profile overlays."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, model_validator

from components.config.agent import AgentConfig, RLConfig
from components.config.base import Seed, _Section
from components.config.data import (
    ENV_NAMES,
    BufferConfig,
    CollectConfig,
    EnvConfig,
    IngestConfig,
    TasksConfig,
    TeacherConfig,
)
from components.config.evaluation import (
    DriftConfig,
    JudgeConfig,
    PolicyFidelityConfig,
    PromotionConfig,
    ReportConfig,
    Theorem1Config,
)
from components.config.experience import (
    AblationConfig,
    CurriculumConfig,
    ExperienceConfig,
    ServingConfig,
    SyntheticEnvConfig,
)
from components.config.orchestration import OrchestrationConfig

PARAMS_FILE = "params.yaml"
PROFILES = ("ci", "cpu", "gpu")


class ConfigError(ValueError):
    """params.yaml is invalid: the message names the key and the problem."""


class Config(_Section):
    """The whole validated configuration of one profile."""

    profile: Literal["ci", "cpu", "gpu"]
    seed: Seed = 0
    ablation: AblationConfig = AblationConfig()
    env: EnvConfig = EnvConfig()
    tasks: TasksConfig
    collect: CollectConfig
    ingest: IngestConfig = IngestConfig()
    buffer: BufferConfig = BufferConfig()
    teacher: TeacherConfig = TeacherConfig()
    experience: ExperienceConfig = ExperienceConfig()
    synthetic: SyntheticEnvConfig = SyntheticEnvConfig()
    serving: ServingConfig = ServingConfig()
    curriculum: CurriculumConfig = CurriculumConfig()
    agent: AgentConfig = AgentConfig()
    rl: RLConfig = RLConfig()
    judge: JudgeConfig = JudgeConfig()
    drift: DriftConfig = DriftConfig()
    report: ReportConfig = ReportConfig()
    theorem1: Theorem1Config = Theorem1Config()
    # a factory: its method check imports components.artifacts, which imports this module
    policy_fidelity: PolicyFidelityConfig = Field(default_factory=PolicyFidelityConfig)
    promotion: PromotionConfig = PromotionConfig()
    orchestration: OrchestrationConfig = OrchestrationConfig()

    def section(self, name: str) -> dict[str, Any]:
        """One section as plain data (for logging params)."""
        return getattr(self, name).model_dump(mode="json")

    @model_validator(mode="after")
    def _rl_seeds_are_agent_seeds(self) -> Config:
        for algo in ("grpo", "ppo"):
            extra = set(getattr(self.rl, algo).seeds or ()) - set(self.agent.seeds)
            if extra:
                raise ValueError(
                    f"rl.{algo}.seeds {sorted(extra)} are not in agent.seeds "
                    f"{list(self.agent.seeds)} (each RL run starts from that seed's SFT policy)"
                )
        return self

    @model_validator(mode="after")
    def _sft_coef_needs_the_scorer(self) -> Config:
        # the behaviour-cloning term is the scorer's loss: an LM policy failed at RL's start
        if self.agent.policy != "scorer":
            for algo in ("grpo", "ppo"):
                coef = getattr(self.rl, algo).sft_coef
                if coef > 0:
                    raise ValueError(
                        f"rl.{algo}.sft_coef {coef} > 0 needs agent.policy: scorer (got "
                        f"{self.agent.policy!r}); set rl.{algo}.sft_coef: 0"
                    )
        return self

    def seeds_of(self, method: str) -> list[int]:
        """The training seeds of a Table-1 method (``<x>_grpo``/``grpo_real``: rl.grpo.seeds)."""
        for algo in ("grpo", "ppo"):
            if algo in method.split("_"):
                return list(getattr(self.rl, algo).seeds or self.agent.seeds)
        return list(self.agent.seeds)


@dataclass(frozen=True)
class Paths:
    """Every file location the stages share, relative to the project root."""

    root: Path

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def tasks(self) -> Path:
        return self.data / "tasks"

    @property
    def tasks_file(self) -> Path:
        return self.tasks / "tasks.jsonl"

    @property
    def raw(self) -> Path:
        return self.data / "raw"

    @property
    def ingested(self) -> Path:
        return self.data / "ingested"

    @property
    def trajectories_file(self) -> Path:
        return self.ingested / "trajectories.jsonl"

    @property
    def transitions_file(self) -> Path:
        return self.ingested / "transitions.parquet"

    @property
    def annotations_file(self) -> Path:
        return self.data / "annotations" / "annotations.jsonl"

    @property
    def buffer(self) -> Path:
        return self.data / "buffer"

    @property
    def quarantine(self) -> Path:
        return self.data / "quarantine"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics"

    @property
    def mlflow_db(self) -> Path:
        return self.root / "mlflow.db"

    @property
    def mlruns(self) -> Path:
        return self.root / "mlruns"

    @property
    def bench_results(self) -> Path:
        return self.root / "bench" / "results"


def _deep_merge(base: dict[str, Any], overlay: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for key, value in overlay.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def _format_errors(err: ValidationError | list[Any], source: str) -> str:
    # one line: a CLI error is a single line on stderr, each problem naming its key
    problems = []
    for e in err.errors() if isinstance(err, ValidationError) else err:
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        value = e.get("input")
        if e["type"] != "extra_forbidden" and isinstance(value, str | int | float | bool):
            shown = repr(value)
            msg += f" (got {shown if len(shown) <= 40 else shown[:37] + '...'})"
        problems.append(f"{key}: {msg}")
    return f"invalid configuration ({source}): " + "; ".join(problems)


def resolve_params(raw: dict[str, Any], profile: str | None = None) -> dict[str, Any]:
    """Defaults, then ``env_overrides`` of the chosen env, then the active profile's
    overlay, deep-merged; returns plain data."""
    raw = dict(raw)
    profiles = raw.pop("profiles", {}) or {}
    if not isinstance(profiles, dict):
        raise ConfigError(
            f"profiles: must be a mapping of profile name -> overrides, "
            f"got {type(profiles).__name__}"
        )
    name = profile or raw.get("profile", "cpu")
    if not isinstance(name, str):
        raise ConfigError(f"profile: must be one of {list(PROFILES)}, got {name!r}")
    unknown = sorted(str(p) for p in set(profiles) - set(PROFILES))
    if unknown:
        raise ConfigError(f"profiles: unknown profile(s) {unknown}; known: {list(PROFILES)}")
    if name not in PROFILES:
        raise ConfigError(f"profile: unknown profile '{name}'; known: {list(PROFILES)}")
    for key, overlay in profiles.items():
        if overlay is not None and not isinstance(overlay, dict):
            raise ConfigError(
                f"profiles.{key}: must be a mapping of overrides (section: values), "
                f"got {type(overlay).__name__}"
            )
    merged = _deep_merge(_env_overlay(raw, profiles.get(name) or {}), profiles.get(name) or {})
    merged["profile"] = name
    return merged


def _env_overlay(raw: dict[str, Any], profile: dict[str, Any]) -> dict[str, Any]:
    """``raw`` with ``env_overrides[<env.name>]`` deep-merged over it (under the profile)."""
    overrides = raw.pop("env_overrides", {}) or {}
    if not isinstance(overrides, dict):
        raise ConfigError(
            f"env_overrides: must be a mapping of env name -> overrides, "
            f"got {type(overrides).__name__}"
        )
    unknown = sorted(str(e) for e in set(overrides) - set(ENV_NAMES))
    if unknown:
        raise ConfigError(f"env_overrides: unknown env(s) {unknown}; known: {list(ENV_NAMES)}")
    # the profile may name the env too (a profile for one env): it decides
    env = {**(raw.get("env") or {}), **(profile.get("env") or {})}
    overlay = overrides.get(env.get("name", "textworld")) or {}
    if not isinstance(overlay, dict):
        raise ConfigError(
            f"env_overrides.{env.get('name')}: must be a mapping of overrides (section: values), "
            f"got {type(overlay).__name__}"
        )
    return _deep_merge(raw, overlay)


class _UniqueKeyLoader(yaml.SafeLoader):
    """A SafeLoader that rejects a key given twice in one mapping (YAML keeps the last)."""

    def construct_mapping(self, node: Any, deep: bool = False) -> dict[Any, Any]:
        if isinstance(node, yaml.MappingNode):
            seen: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue  # `<<: *defaults` may be overridden by explicit keys
                key = self.construct_object(key_node, deep=True)
                try:
                    first = seen.get(key)
                except TypeError:
                    continue  # unhashable: the base class reports it
                if first is not None:
                    raise yaml.constructor.ConstructorError(
                        None,
                        None,
                        f"duplicate key {key!r} (first at line {first})",
                        key_node.start_mark,
                    )
                seen[key] = key_node.start_mark.line + 1
        return super().construct_mapping(node, deep=deep)


def _read_params(path: Path) -> dict[str, Any]:
    """The params file as a mapping; every problem is a one-line ``ConfigError``."""
    if path.is_dir():
        raise ConfigError(f"{path} is a folder, not a params file (pass --params path/to/file)")
    if not path.exists():
        raise ConfigError(f"{path} not found (run from the project root or pass --params)")
    try:
        data = path.read_bytes()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read it ({err.strerror or err})") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data[: err.start].count(b"\n") + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset "
            f"{err.start}); save the file as UTF-8"
        ) from None
    try:
        raw = yaml.load(text, Loader=_UniqueKeyLoader) or {}  # a SafeLoader subclass
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = " ".join(str(err.problem or err.context or "invalid YAML").split())
        raise ConfigError(f"{where}: YAML error: {problem}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: YAML error: {' '.join(str(err).split())}") from None
    except RecursionError:
        raise ConfigError(f"{path}: YAML error: nested too deeply") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: top level must be a mapping, got {type(raw).__name__}")
    return raw


def _validate_other_envs(raw: dict[str, Any], path: Path, active_env: str) -> None:
    """Every other env's ``env_overrides`` entry under every profile: a typo there would
    otherwise surface only once `dvc exp run -S env.name=<env>` had started."""
    overrides = raw.get("env_overrides") or {}
    for env, overlay in overrides.items():
        if env == active_env or not overlay:
            continue
        as_env = {**raw, "env": {**(raw.get("env") or {}), "name": env}}
        sets = _leaf_paths(overlay)
        for name in PROFILES:
            try:
                Config.model_validate(resolve_params(as_env, name))
            except ValidationError as err:
                # only what the entry itself sets: the top level may hold what only the
                # active env allows (env.reward: score), which this env never runs with.
                # A cross-field rule (no loc) may pit the entry against such a top-level
                # value (agent.policy: lm vs this env's sft_coef): it is checked when the
                # env is the active one, before any stage runs.
                own = [
                    e
                    for e in err.errors()
                    if e["loc"] and _overlaps(tuple(map(str, e["loc"])), sets)
                ]
                if own:
                    where = f"{path}, env_overrides.{env}, profile '{name}'"
                    raise ConfigError(_format_errors(own, where)) from None


def _leaf_paths(tree: Any, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    """Every key path of a nested mapping down to its leaves."""
    if not isinstance(tree, dict) or not tree:
        return [prefix]
    return [p for k, v in tree.items() for p in _leaf_paths(v, (*prefix, str(k)))]


def _overlaps(loc: tuple[str, ...], paths: list[tuple[str, ...]]) -> bool:
    """Whether an error at ``loc`` concerns one of ``paths`` (either is a prefix of the other)."""
    return any(loc[: len(p)] == p or p[: len(loc)] == loc for p in paths)


def load_config(path: str | Path = PARAMS_FILE, profile: str | None = None) -> Config:
    """Load params.yaml, apply the profile overlay and validate everything."""
    path = Path(path)
    raw = _read_params(path)
    if profile is not None and profile not in PROFILES:  # --profile, not the file's fault
        raise ConfigError(f"--profile: unknown profile '{profile}'; known: {list(PROFILES)}")
    try:
        active = resolve_params(raw, profile)["profile"]
        # Validate every profile, not only the active one, so a typo in the gpu overlay is
        # caught on the laptop rather than on the expensive machine; the active one first,
        # so a bad default is reported under the profile the user runs.
        configs = {}
        for name in sorted(PROFILES, key=lambda n: n != active):
            merged = resolve_params(raw, name)
            try:
                configs[name] = Config.model_validate(merged)
            except ValidationError as err:
                raise ConfigError(_format_errors(err, f"{path}, profile '{name}'")) from None
        _validate_other_envs(raw, path, configs[active].env.name)
    except ConfigError as err:
        # `dvc exp run -S key=value` writes params.yaml before any stage runs and does not
        # undo it when the stage fails: say how to get the committed file back
        raise ConfigError(
            f"{err} (if `dvc exp run -S` wrote this, restore it: git checkout {path})"
        ) from None
    return configs[active]
