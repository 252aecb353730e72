"""Sections of evaluation: judge, drift, report, Theorem 1 and model promotion."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, field_validator, model_validator

from components.config.base import Seed, _Section


class JudgeConfig(_Section):
    """Judge of synthetic trajectories: the paper's four criteria on a 0/1/2 rubric."""

    backend: Literal["grounded", "openai"] = Field(
        "grounded", description="grounded: replay in the real simulator (offline); openai: LLM"
    )
    n_trajectories: int = Field(100, ge=1, description="seeded sample judged per variant")
    seed: Seed = Field(0, description="sampling seed")
    consistency_f1_high: float = Field(
        0.9, gt=0, le=1, description="grounded: next-state token F1 scored 2 (reward right)"
    )
    consistency_f1_low: float = Field(
        0.5, ge=0, le=1, description="grounded: next-state token F1 scored 1 (reward right)"
    )
    hallucination_tolerance: float = Field(
        0.25, ge=0, le=1, description="grounded: share of unknown entities still scored 1"
    )
    informativeness_recall: float = Field(
        0.5, gt=0, le=1, description="grounded: recall of the real effect that counts as carried"
    )
    diversity_high: float = Field(
        0.6, gt=0, le=1, description="distinct next states/actions per transition scored 2"
    )
    diversity_low: float = Field(
        0.3, ge=0, le=1, description="distinct next states/actions per transition scored 1"
    )
    max_steps_shown: int = Field(30, ge=1, description="openai: steps shown per trajectory")
    max_state_chars: int = Field(800, ge=50, description="openai: characters shown per state")
    model: str = Field("gpt-4o", description="openai: judge model")
    base_url: str | None = Field(None, description="openai: compatible server URL (vLLM etc.)")
    api_key_env: str = Field("OPENAI_API_KEY", description="env var holding the API key")
    concurrency: int = Field(8, ge=1, description="openai: parallel requests")
    max_retries: int = Field(5, ge=0, description="openai: retries (timeouts, 429/5xx, malformed)")
    timeout_s: float = Field(60.0, gt=0, description="openai: per-request timeout")
    max_cost_usd: float | None = Field(
        5.0, ge=0, description="openai: per run, stop before a request that could exceed it"
    )
    max_tokens: int = Field(256, ge=16, description="openai: max completion tokens per verdict")
    temperature: float = Field(0.0, ge=0, description="openai: sampling temperature")
    backoff_base_s: float = Field(1.0, gt=0, description="openai: first retry delay (doubles)")
    backoff_max_s: float = Field(60.0, gt=0, description="openai: cap on one retry delay")
    price_input_per_mtok: float | None = Field(None, ge=0, description="USD per 1M prompt tokens")
    price_output_per_mtok: float | None = Field(None, ge=0, description="USD per 1M output tokens")

    @model_validator(mode="after")
    def _ordered(self) -> JudgeConfig:
        if self.consistency_f1_low > self.consistency_f1_high:
            raise ValueError("consistency_f1_low must be <= consistency_f1_high")
        if self.diversity_low > self.diversity_high:
            raise ValueError("diversity_low must be <= diversity_high")
        return self


def evidently_stat_test_problem(name: str, kind: Literal["num", "cat"]) -> str | None:
    """Why ``name`` is no Evidently stat test of ``kind`` columns; None if it is one.

    Evidently's registry is imported here, only when a method is named (it takes seconds).
    """
    try:
        import evidently.legacy.calculations.stattests  # noqa: F401  (registers the tests)
        from evidently.legacy.calculations.stattests import registry
        from evidently.legacy.core import ColumnType
    except ImportError:  # another Evidently layout: the drift stage reports it
        return None
    try:
        registry.get_registered_stattest(name, ColumnType(kind))
    except ValueError:  # StatTestNotFoundError, StatTestInvalidFeatureTypeError
        tests = getattr(registry, "_registered_stat_tests", {})
        known = sorted(t for t, types in tests.items() if ColumnType(kind) in types)
        what = "numerical" if kind == "num" else "categorical"
        return f"{name!r} is no Evidently stat test for {what} columns; known: {known}"
    return None


class DriftConfig(_Section):
    """Drift of synthetic from real transitions (Evidently), per co-evolution iteration."""

    embedder: Literal["hashing", "wordllama", "minilm", "none"] = Field(
        "wordllama", description="embeddings of (task, state, action); hashing: no model"
    )
    embedding_components: int = Field(
        2, ge=0, description="principal components tested besides the centroid distance"
    )
    max_rows: int = Field(2000, ge=10, description="seeded subsample of transitions per side")
    min_vocab_episodes: int = Field(
        2, ge=1, description="a word is in the real vocabulary if this many real episodes use it"
    )
    drift_share: float = Field(
        0.5, gt=0, le=1, description="overall drift flag: share of drifted features >= this"
    )
    num_method: str | None = Field(None, description="Evidently stat test, numeric (None: auto)")
    cat_method: str | None = Field(None, description="Evidently stat test, categorical")
    threshold: float | None = Field(None, gt=0, description="stat-test threshold (None: default)")
    seed: Seed = Field(0, description="subsampling seed")
    workers: int = Field(
        2, ge=1, description="processes running the per-iteration Evidently reports (same results)"
    )

    @field_validator("num_method", "cat_method")
    @classmethod
    def _known_stat_test(cls, name: str | None, info: ValidationInfo) -> str | None:
        # a typo failed only in the drift stage, with Evidently's StatTestNotFoundError
        if name is not None:
            kind = "num" if info.field_name == "num_method" else "cat"
            problem = evidently_stat_test_problem(name, kind)
            if problem:
                raise ValueError(problem)
        return name


class ReportConfig(_Section):
    """The pipeline's markdown + PNG summary."""

    title: str = Field("DreamGym pipeline report", min_length=1)
    dpi: int = Field(100, ge=30, le=300, description="resolution of the PNG plots")
    paper_reference: bool = Field(True, description="add the paper's Table-1 numbers")


class Theorem1Config(_Section):
    """Theorem 1's terms per DreamGym RL round, measured (components/evaluation/theorem1.py)."""

    snapshots: bool = Field(
        True,
        description="train_dreamgym keeps every round's policy weights (the real gains need "
        "them; ~4 MB per round for the cpu policy, adapters only under LoRA)",
    )
    algos: list[Literal["grpo", "ppo"]] = Field(
        default_factory=lambda: ["grpo", "ppo"], description="the DreamGym runs to measure"
    )
    split: Literal["train", "validation"] = Field(
        "validation", description="real tasks of the real gains (never test: it stays held out)"
    )
    max_rounds: int | None = Field(
        12, ge=2, description="measure the first N rounds only (None: every round)"
    )
    max_trajectories: int = Field(
        16, ge=1, description="synthetic trajectories per round replayed for eps_R and eps_P"
    )
    workers: int = Field(
        2, ge=1, description="processes measuring the runs, one run each (same results as 1)"
    )


class PolicyFidelityConfig(_Section):
    """Fixed policies on the same train games, dreamt and real (policy-level fidelity)."""

    methods: list[str] = Field(
        default_factory=lambda: ["sft", "dreamgym_grpo"],
        min_length=1,
        description="Table-1 methods whose first-seed policy plays; gains are over the "
        "first (dvc.yaml's policy_fidelity deps list sft's and dreamgym_grpo's models: add "
        "another method's there too)",
    )
    games_per_family: int = Field(
        20, ge=1, description="train games of each task family (a seeded sample)"
    )
    passes: int = Field(3, ge=1, description="sampled episodes per game and side")
    seed: Seed = Field(0, description="game sample and decoding seed")

    @model_validator(mode="after")
    def _known_methods(self) -> PolicyFidelityConfig:
        from components.artifacts import METHODS, RANDOM

        unknown = [m for m in self.methods if m not in METHODS]
        if unknown:
            raise ValueError(f"policy_fidelity.methods: {unknown} not in {list(METHODS)}")
        if RANDOM in self.methods:  # failed mid-stage: "no policy under .../random/seed-0"
            raise ValueError("policy_fidelity.methods: random has no trained policy to play")
        return self


class PromotionConfig(_Section):
    """When a registered candidate model replaces the champion (components/evaluation)."""

    margin: float = Field(
        0.02, ge=0, description="the candidate must beat the champion's held-out metric by this"
    )
    experience_metric: str = Field(
        "reward_accuracy",
        description="held-out metric of the experience model (reward_accuracy has a 95% CI)",
    )
