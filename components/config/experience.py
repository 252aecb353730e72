"""Sections of the experience model: ablations, its SFT, the synthetic env, serving, curriculum."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from components.config.base import (
    Bf16,
    EvalLossExamples,
    GradAccum,
    LearningRate,
    LoggingSteps,
    LoRAAlpha,
    LoRARank,
    OptimizerSteps,
    SaveSteps,
    Seed,
    TrainMinutes,
    UseLoRA,
    WarmupRatio,
    WeightDecay,
    _Section,
)

GROUNDED_MODEL = "grounded"  # experience.model of the cpu profile (no LLM)


class AblationConfig(_Section):
    """Switches for the paper's ablations (all False = the full method)."""

    no_replay: bool = Field(False, description="k = 0 retrieved experiences, no co-evolution")
    no_reasoning: bool = Field(False, description="experience model answers without <think>")
    no_history: bool = Field(False, description="history_len = 0 for the experience model")
    no_task_generation: bool = Field(False, description="curriculum generates no new tasks")


class ExperienceConfig(_Section):
    """The reasoning experience model: base model, prompt shape, SFT and fidelity settings."""

    model: str = Field(
        GROUNDED_MODEL,
        description="grounded (components/experience/grounded.py) | tiny (from a config) | "
        "smollm2 (packaged GGUF) | hub name/path",
    )
    tiny_preset: Literal["nano", "micro", "mini", "small"] = Field(
        "micro", description="size preset of the from-scratch model (model=tiny)"
    )
    vocab_size: int = Field(4096, ge=300, description="BPE vocabulary trained for model=tiny")
    history_len: int = Field(2, ge=0, description="previous steps in the prompt (0 = none)")
    state_target: Literal["full", "delta"] = Field(
        "delta",
        description="what <state> holds: the whole next state, or only its changed "
        "'Key: value' lines (decoded exactly against the current state)",
    )
    max_length: int = Field(
        2048, ge=64, description="max prompt+answer tokens; longer examples are dropped"
    )
    max_train_examples: int | None = Field(
        1400, ge=1, description="seeded subset of train transitions (None = all)"
    )
    min_success_share: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="with max_train_examples: at least this share of the subset are "
        "reward-1 steps (as many as exist); 0 = a plain random subset",
    )
    epochs: float = Field(1.0, gt=0, description="passes over the train examples")
    max_steps: OptimizerSteps = 350
    max_train_minutes: TrainMinutes = 20
    learning_rate: LearningRate = 2e-3
    batch_size: int = Field(4, ge=1, description="sequences per device step")
    grad_accum: GradAccum = 1
    warmup_ratio: WarmupRatio = 0.05
    weight_decay: WeightDecay = 0.0
    bf16: Bf16 = None
    lora: UseLoRA = False
    lora_r: LoRARank = 16
    lora_alpha: LoRAAlpha = 32
    logging_steps: LoggingSteps = 10
    save_steps: SaveSteps = 50
    eval_loss_examples: EvalLossExamples = 32
    eval_examples: int = Field(
        200, ge=1, description="validation transitions generated for fidelity"
    )
    max_new_tokens: int = Field(512, ge=8, description="generation cap per answer")
    gen_batch_size: int = Field(8, ge=1, description="prompts per generate call")
    temperature: float = Field(0.0, ge=0, description="fidelity decoding (0 = greedy)")
    task_gen_examples: int = Field(
        200, ge=0, description="task-generation head examples mixed into the full model's SFT"
    )
    open_loop_episodes: int = Field(
        20, ge=0, description="validation episodes rolled out open-loop by the full model"
    )
    open_loop_horizon: int = Field(5, ge=1, description="depth of the open-loop rollouts")
    seed: Seed = Field(0, description="data subset, init and training seed")


class SyntheticEnvConfig(_Section):
    """The synthetic environment driven by the experience model (DreamGym's simulator)."""

    max_steps: int = Field(20, ge=1, description="step limit per synthetic episode")
    history_len: int = Field(2, ge=0, description="previous steps in the prompt (0 = none)")
    k: int = Field(3, ge=0, description="retrieved transitions per step (0 = no replay)")
    temperature: float = Field(0.0, ge=0, description="decoding temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling when temperature > 0")
    resample_temperature: float = Field(
        0.7, gt=0, description="temperature of the one resample after a malformed answer"
    )
    max_new_tokens: int = Field(224, ge=8, description="generation cap per answer")
    gen_batch_size: int = Field(32, ge=1, description="prompts per forward batch")
    seed: Seed = Field(0, description="sampling seed")


SERVING_BACKENDS = ("local", "openai")


class ServingConfig(_Section):
    """Where the experience model (and, on request, the LM policy) answers from: in-process
    transformers or a served model."""

    backend: Literal["local", "openai"] = Field(
        "local",
        description="local: load experience_model with transformers in this process; "
        "openai: an OpenAI-compatible server (e.g. vLLM) serving it",
    )
    experience_model: str = Field(
        "models/experience/full",
        description="local: model directory (relative to the project root); "
        "openai: the served model name (vLLM --served-model-name)",
    )
    base_url_env: str = Field(
        "DREAMGYM_OPENAI_BASE_URL",
        description="openai: env var holding the server URL, e.g. http://127.0.0.1:8000/v1",
    )
    api_key_env: str = Field(
        "DREAMGYM_OPENAI_API_KEY",
        description="openai: env var holding the server's key (unset: 'EMPTY', vLLM's default)",
    )
    concurrency: int = Field(32, ge=1, description="openai: requests in flight")
    max_retries: int = Field(5, ge=0, description="openai: retries on timeout/429/5xx/bad body")
    timeout_s: float = Field(120.0, gt=0, description="openai: per-request timeout")
    policy_backend: Literal["local", "openai"] = Field(
        "local",
        description="agent.policy lm, held-out evaluation: local = decode in this process; "
        "openai = an OpenAI-compatible server at the URL in base_url_env (RL rollouts always "
        "decode locally: their weights change every round)",
    )
    policy_model: str | None = Field(
        None,
        description="policy_backend openai: the served model name of every policy; None = "
        "each policy's directory relative to the project root (vllm serve <dir>'s name)",
    )


class CurriculumConfig(_Section):
    """Curriculum task generation: variance-based seeds, lambda mixing, PPO clusters."""

    batch_size: int = Field(
        16,
        ge=1,
        description="tasks per batch; the DreamGym stage sets it to rl.<algo>.tasks_per_iteration",
    )
    lambda_generated: float = Field(
        0.25, ge=0, le=1, description="max share of generated tasks per batch (floor)"
    )
    seeds_per_iteration: int = Field(4, ge=0, description="highest-variance tasks used as seeds")
    variants_per_seed: int = Field(2, ge=0, description="variants generated per seed task")
    min_variance: float = Field(
        0.0, ge=0, le=0.25, description="seeds need a reward variance above this"
    )
    min_task_chars: int = Field(12, ge=1, description="shortest acceptable generated task")
    max_task_chars: int = Field(400, ge=1, description="longest acceptable generated task")
    task_temperature: float = Field(0.8, gt=0, description="sampling temperature of variants")
    task_max_new_tokens: int = Field(96, ge=8, description="generation cap per task/state")
    n_clusters: int = Field(8, ge=1, description="PPO: k-means clusters of task embeddings")
    variance_bins: int = Field(
        5, ge=1, le=100, description="bins of the logged variance histogram (at most 100)"
    )
    seed: Seed = Field(0, description="selection, sampling and k-means seed")
    generated_order: Literal["newest", "frontier"] = Field(
        "newest",
        description="which generated tasks fill the generated share of a batch: newest = "
        "the newest first; frontier = those whose last group had mixed outcomes, then new "
        "and untried ones; a generated task whose last group tied (all won or all lost) is "
        "retired and its slot goes to a real task",
    )
    max_real_tasks: int = Field(
        0,
        ge=0,
        description="DreamGym: train on this many of the real train tasks (a fixed random "
        "subset, the same for every seed; 0 = all), to measure what generated tasks add "
        "when real tasks are scarce",
    )
