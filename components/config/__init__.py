"""Typed, frozen configuration built from ``params.yaml``.

``params.yaml`` holds the default values of every section, a ``profile`` key naming the
active profile and a ``profiles`` mapping of overlays (``ci``, ``cpu``, ``gpu``). The
active overlay is deep-merged over the defaults, then validated: unknown keys and wrong
types are errors that name the offending key. Every stage receives one ``Config``.
"""

from __future__ import annotations

# Every name of the former single module config.py stays importable from here, the private
# ones (_Section, the loading helpers) included: hence the noqa on those imports.
from components.config.agent import (
    AgentConfig,
    GRPOConfig,
    PolicyDPOConfig,
    PolicyEvalConfig,
    PolicySFTConfig,
    PPOConfig,
    RLAlgoConfig,
    RLConfig,
    ScorerConfig,
)
from components.config.base import _Section  # noqa: F401
from components.config.data import (
    ENV_NAMES,
    AgentGymConfig,
    BufferConfig,
    CollectConfig,
    EnvConfig,
    EnvName,
    ExternalGamesConfig,
    ExternalTaskListConfig,
    ExternalTasksConfig,
    IngestConfig,
    MiniWoBConfig,
    ScienceWorldConfig,
    SplitConfig,
    SplitCountsConfig,
    TaskFamilyConfig,
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
    SERVING_BACKENDS,
    AblationConfig,
    CurriculumConfig,
    ExperienceConfig,
    ServingConfig,
    SyntheticEnvConfig,
)
from components.config.loading import (  # noqa: F401
    PARAMS_FILE,
    PROFILES,
    Config,
    ConfigError,
    Paths,
    _deep_merge,
    _format_errors,
    _read_params,
    _UniqueKeyLoader,
    load_config,
    resolve_params,
)
from components.config.orchestration import TASK_RUNNERS, OrchestrationConfig

__all__ = [
    "ENV_NAMES",
    "PARAMS_FILE",
    "PROFILES",
    "SERVING_BACKENDS",
    "TASK_RUNNERS",
    "AblationConfig",
    "AgentConfig",
    "AgentGymConfig",
    "BufferConfig",
    "CollectConfig",
    "Config",
    "ConfigError",
    "CurriculumConfig",
    "DriftConfig",
    "EnvConfig",
    "EnvName",
    "ExperienceConfig",
    "ExternalGamesConfig",
    "ExternalTaskListConfig",
    "ExternalTasksConfig",
    "GRPOConfig",
    "IngestConfig",
    "JudgeConfig",
    "MiniWoBConfig",
    "OrchestrationConfig",
    "PPOConfig",
    "Paths",
    "PolicyDPOConfig",
    "PolicyEvalConfig",
    "PolicyFidelityConfig",
    "PolicySFTConfig",
    "PromotionConfig",
    "RLAlgoConfig",
    "RLConfig",
    "ReportConfig",
    "ScienceWorldConfig",
    "ScorerConfig",
    "ServingConfig",
    "SplitConfig",
    "SplitCountsConfig",
    "SyntheticEnvConfig",
    "TaskFamilyConfig",
    "TasksConfig",
    "TeacherConfig",
    "Theorem1Config",
    "load_config",
    "resolve_params",
]
