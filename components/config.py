"""Typed, frozen configuration built from ``params.yaml``.

``params.yaml`` holds the default values of every section, a ``profile`` key naming the
active profile and a ``profiles`` mapping of overlays (``ci``, ``cpu``, ``gpu``). The
active overlay is deep-merged over the defaults, then validated: unknown keys and wrong
types are errors that name the offending key. Every stage receives one ``Config``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

PARAMS_FILE = "params.yaml"
PROFILES = ("ci", "cpu", "gpu")


class ConfigError(ValueError):
    """params.yaml is invalid: the message names the key and the problem."""


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class AblationConfig(_Section):
    """Switches for the paper's ablations (all False = the full method)."""

    no_replay: bool = Field(False, description="k = 0 retrieved experiences, no co-evolution")
    no_reasoning: bool = Field(False, description="experience model answers without <think>")
    no_history: bool = Field(False, description="history_len = 0 for the experience model")
    no_task_generation: bool = Field(False, description="curriculum generates no new tasks")


# textworld / scienceworld / miniwob run locally; the paper's three go through adapters
# (AgentGym-style HTTP env servers the user runs, see components/envs/agentgym_http.py)
ENV_NAMES = ("textworld", "scienceworld", "miniwob", "webshop", "alfworld", "webarena")
EnvName = Literal["textworld", "scienceworld", "miniwob", "webshop", "alfworld", "webarena"]


class SplitCountsConfig(_Section):
    """How many task instances (variations, seeds) per split, for each task name."""

    train: int = Field(8, ge=1)
    validation: int = Field(2, ge=0)
    test: int = Field(3, ge=1, description="held out: never collected or trained on")


class ScienceWorldConfig(_Section):
    """ScienceWorld task suite (env.name = scienceworld): task types and variations."""

    task_names: tuple[str, ...] = Field(
        (
            "find-non-living-thing",
            "find-animal",
            "find-plant",
            "lifespan-longest-lived",
            "power-component",
            "chemistry-mix-paint-secondary-color",
        ),
        min_length=1,
        description="ScienceWorld task names (gold paths of 5-17 steps by default)",
    )
    variations: SplitCountsConfig = Field(
        SplitCountsConfig(),
        description="variations per task and split, from ScienceWorld's own train/dev/test lists",
    )
    simplifications: str = Field("", description="e.g. 'easy' or 'openDoors,teleportAction'")
    max_admissible: int = Field(40, ge=4, description="bound on the admissible-action list")


class MiniWoBConfig(_Section):
    """MiniWoB++ task suite (env.name = miniwob) in headless Debian Chromium."""

    task_names: tuple[str, ...] = Field(
        (
            "click-button-sequence",
            "enter-text",
            "enter-password",
            "login-user",
            "click-checkboxes",
            "choose-list",
            "click-option",
            "navigate-tree",
            "search-engine",
            "use-autocomplete-nodelay",
        ),
        min_length=1,
        description="MiniWoB++ task names (each has a scripted expert)",
    )
    seeds: SplitCountsConfig = Field(
        SplitCountsConfig(train=10, validation=2, test=4),
        description="episode seeds per task and split (disjoint seed ranges per split)",
    )
    max_elements: int = Field(20, ge=3, le=60, description="elements shown in the state")
    chrome_binary: str = Field("/usr/lib/chromium/chromium", description="Chromium binary")
    chromedriver: str = Field("/usr/bin/chromedriver", description="ChromeDriver binary")
    timeout_s: float = Field(30.0, gt=0, description="page load / script timeout")


class AgentGymConfig(_Section):
    """Adapters for WebShop / ALFWorld / WebArena served by AgentGym-style HTTP env servers."""

    url_env: str = Field(
        "AGENTGYM_URL", description="env var holding the server base URL (e.g. http://host:36001)"
    )
    base_url: str | None = Field(None, description="server base URL; overrides url_env")
    timeout_s: float = Field(60.0, gt=0, description="per-request timeout")
    max_retries: int = Field(3, ge=0, description="retries of I/O failures (never of app errors)")
    backoff_s: float = Field(0.5, gt=0, description="first retry delay (doubles)")
    splits: dict[Literal["train", "validation", "test"], tuple[int, int]] = Field(
        {"train": (0, 200), "validation": (200, 250), "test": (250, 350)},
        description="[start, stop) item indices (session / game / config ids) per split",
    )
    browsergym: bool = Field(False, description="webarena through BrowserGym (if installed)")


class EnvConfig(_Section):
    """Which real environment the pipeline runs on, and each env's own settings."""

    name: EnvName = Field("textworld", description="real environment")
    max_steps: int = Field(30, ge=1, description="step limit per episode (then truncated)")
    scienceworld: ScienceWorldConfig = ScienceWorldConfig()
    miniwob: MiniWoBConfig = MiniWoBConfig()
    agentgym: AgentGymConfig = AgentGymConfig()


class TaskFamilyConfig(_Section):
    """One family of generated games."""

    name: Literal["quest", "cooking", "treasure"] = Field(description="generator family")
    n_games: int = Field(ge=1, description="games to generate for this family")
    instruction: Literal["walkthrough", "goal"] = Field(
        "walkthrough",
        description="walkthrough: TextWorld's objective, which spells out every step; goal: "
        "only its last sentence (what to get and where), so the agent has to explore",
    )
    min_difficulty: int = Field(1, ge=1, description="lowest difficulty (family-specific)")
    max_difficulty: int = Field(3, ge=1, description="highest difficulty (family-specific)")

    @model_validator(mode="after")
    def _ordered(self) -> TaskFamilyConfig:
        if self.min_difficulty > self.max_difficulty:
            raise ValueError("min_difficulty must be <= max_difficulty")
        return self


class SplitConfig(_Section):
    """Fractions of games per split; the rest of 1 - train - validation is the test split."""

    train: float = Field(0.7, gt=0, lt=1)
    validation: float = Field(0.15, ge=0, lt=1)

    @model_validator(mode="after")
    def _leaves_test(self) -> SplitConfig:
        if self.train + self.validation >= 1:
            raise ValueError("train + validation must leave room for a held-out test split")
        return self


class TasksConfig(_Section):
    """Deterministic task-suite generation (games are split by game, never by episode)."""

    families: tuple[TaskFamilyConfig, ...] = Field(description="families of games")
    split: SplitConfig = SplitConfig()
    workers: int = Field(2, ge=1, description="parallel game-generation processes")


class CollectConfig(_Section):
    """Real trajectory collection: how many episodes per game and policy.

    Demonstrations are the scarce resource (as in the paper): only ``demo_games`` train
    games get the ``episodes`` mix (the expert among them); every other train game gets
    ``explore_episodes`` (random play: the offline logs the experience model learns the
    world from, no demonstration in them). Validation games get ``episodes``.
    """

    episodes: dict[Literal["expert", "noisy", "random", "explore"], Annotated[int, Field(ge=0)]] = (
        Field(description="episodes per demonstration (and validation) game for each policy")
    )
    demo_games: int | None = Field(
        None, ge=1, description="train games with demonstrations (None = every train game)"
    )
    explore_episodes: dict[
        Literal["expert", "noisy", "random", "explore"], Annotated[int, Field(ge=0)]
    ] = Field(default_factory=dict, description="episodes per other train game for each policy")
    epsilon: float = Field(0.3, ge=0, le=1, description="noisy policy: random-action rate")
    p_invalid: float = Field(
        0.05, ge=0, le=1, description="noisy/random: rate of inadmissible commands"
    )
    splits: tuple[Literal["train", "validation", "test"], ...] = Field(
        ("train", "validation"),
        description="splits to collect from; the test split is only for evaluation",
    )
    workers: int = Field(2, ge=1, description="parallel collection processes")
    round: int = Field(
        0,
        ge=0,
        description="collection round: a new round draws new episodes (new ids and seeds) on "
        "the same train/validation tasks and replaces the old ones; the nightly refresh bumps it",
    )

    @model_validator(mode="after")
    def _some_episodes(self) -> CollectConfig:
        if not any(self.episodes.values()):
            raise ValueError("episodes: at least one policy needs a count > 0")
        return self


class IngestConfig(_Section):
    """Validation bounds applied when raw trajectories are ingested."""

    max_line_bytes: int = Field(2_000_000, ge=1, description="longer JSONL lines are rejected")
    max_state_chars: int = Field(4000, ge=1, description="upper bound on state text length")
    max_action_chars: int = Field(200, ge=1, description="upper bound on action text length")
    max_depth: int = Field(
        32, ge=4, le=100, description="deeper-nested JSON lines are rejected before parsing"
    )


class BufferConfig(_Section):
    """The LanceDB replay buffer: embeddings, retrieval and the co-evolution cap."""

    embedder: Literal["minilm", "wordllama", "sentence-transformers"] = Field(
        "minilm", description="minilm: packaged all-MiniLM-L6-v2; wordllama: fast static"
    )
    model_name: str | None = Field(
        None, description="sentence-transformers model name/path (embedder=sentence-transformers)"
    )
    batch_size: int = Field(256, ge=1, description="texts per embedding batch")
    k: int = Field(3, ge=0, description="transitions retrieved per query (0 = no replay)")
    synthetic_cap: int = Field(50_000, ge=0, description="max synthetic rows kept")
    eviction: Literal["oldest", "reservoir"] = Field(
        "oldest", description="how synthetic rows are evicted above the cap"
    )
    index_min_rows: int = Field(
        5_000, ge=256, description="build an ANN index from this many rows; exact below"
    )


class TeacherConfig(_Section):
    """Teacher annotation of every transition with a reasoning trace."""

    backend: Literal["grounded", "openai", "hf"] = Field(
        "grounded", description="grounded: offline, from simulator ground truth"
    )
    model: str = Field("gpt-4o", description="model name for openai/hf backends")
    style: Literal["full", "concise"] = Field(
        "full", description="grounded: full trace, or a short one for small experience models"
    )
    base_url: str | None = Field(None, description="OpenAI-compatible server URL (vLLM etc.)")
    api_key_env: str = Field("OPENAI_API_KEY", description="env var holding the API key")
    concurrency: int = Field(8, ge=1, description="parallel requests (openai backend)")
    max_retries: int = Field(
        5, ge=0, description="retries on timeout/429/5xx/bad body/malformed answer"
    )
    timeout_s: float = Field(60.0, gt=0, description="per-request timeout")
    max_cost_usd: float | None = Field(
        None, ge=0, description="per run: stop before a request that could exceed it"
    )
    history_len: int = Field(2, ge=0, description="previous steps shown to the teacher")
    max_tokens: int = Field(512, ge=1, description="max completion tokens per answer")
    temperature: float = Field(0.0, ge=0, description="sampling temperature (0 = greedy)")
    batch_size: int = Field(8, ge=1, description="hf: sequences per generate call")
    backoff_base_s: float = Field(1.0, gt=0, description="first retry delay (doubles)")
    backoff_max_s: float = Field(60.0, gt=0, description="cap on one retry delay")
    price_input_per_mtok: float | None = Field(
        None, ge=0, description="USD per 1M prompt tokens (None: built-in table by model)"
    )
    price_output_per_mtok: float | None = Field(
        None, ge=0, description="USD per 1M completion tokens (None: built-in table by model)"
    )


class ExperienceConfig(_Section):
    """The reasoning experience model: base model, prompt shape, SFT and fidelity settings."""

    model: str = Field(
        "tiny", description="tiny (from a config) | smollm2 (packaged GGUF) | hub name/path"
    )
    tiny_preset: Literal["nano", "micro", "mini", "small"] = Field(
        "mini", description="size preset of the from-scratch model (model=tiny)"
    )
    vocab_size: int = Field(4096, ge=300, description="BPE vocabulary trained for model=tiny")
    history_len: int = Field(2, ge=0, description="previous steps in the prompt (0 = none)")
    state_target: Literal["full", "delta"] = Field(
        "full",
        description="what <state> holds: the whole next state, or only its changed "
        "'Key: value' lines (decoded exactly against the current state)",
    )
    max_length: int = Field(
        2048, ge=64, description="max prompt+answer tokens; longer examples are dropped"
    )
    max_train_examples: int | None = Field(
        None, ge=1, description="seeded subset of train transitions (None = all)"
    )
    min_success_share: float = Field(
        0.0,
        ge=0.0,
        le=1.0,
        description="with max_train_examples: at least this share of the subset are "
        "reward-1 steps (as many as exist); 0 = a plain random subset",
    )
    epochs: float = Field(1.0, gt=0, description="passes over the train examples")
    max_steps: int = Field(-1, ge=-1, description="optimizer steps (-1 = use epochs)")
    max_train_minutes: float | None = Field(
        None, gt=0, description="stop training (and save) after this wall-clock budget"
    )
    learning_rate: float = Field(1e-3, gt=0)
    batch_size: int = Field(4, ge=1, description="sequences per device step")
    grad_accum: int = Field(1, ge=1, description="gradient accumulation steps")
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    bf16: bool | None = Field(
        None, description="bf16 autocast (None = on a CUDA GPU that supports it)"
    )
    lora: bool = Field(False, description="train LoRA adapters (merged before saving)")
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    logging_steps: int = Field(10, ge=1)
    save_steps: int = Field(100, ge=1, description="checkpoint interval (resume after a kill)")
    eval_loss_examples: int = Field(
        32, ge=0, description="validation examples for the teacher-forced eval loss"
    )
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
    seed: int = Field(0, description="data subset, init and training seed")


class SyntheticEnvConfig(_Section):
    """The synthetic environment driven by the experience model (DreamGym's simulator)."""

    max_steps: int = Field(30, ge=1, description="step limit per synthetic episode")
    history_len: int = Field(2, ge=0, description="previous steps in the prompt (0 = none)")
    k: int = Field(3, ge=0, description="retrieved transitions per step (0 = no replay)")
    temperature: float = Field(0.0, ge=0, description="decoding temperature (0 = greedy)")
    top_p: float = Field(1.0, gt=0, le=1, description="nucleus sampling when temperature > 0")
    resample_temperature: float = Field(
        0.7, gt=0, description="temperature of the one resample after a malformed answer"
    )
    max_new_tokens: int = Field(224, ge=8, description="generation cap per answer")
    gen_batch_size: int = Field(32, ge=1, description="prompts per forward batch")
    seed: int = Field(0, description="sampling seed")


SERVING_BACKENDS = ("local", "openai")


class ServingConfig(_Section):
    """Where the experience model answers from: in-process transformers or a served model."""

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


class CurriculumConfig(_Section):
    """Curriculum task generation: variance-based seeds, lambda mixing, PPO clusters."""

    batch_size: int = Field(16, ge=1, description="tasks per iteration's task batch")
    n_rollouts: int = Field(8, ge=1, description="rollouts per task (the GRPO group)")
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
    variance_bins: int = Field(5, ge=1, description="bins of the logged variance histogram")
    seed: int = Field(0, description="selection, sampling and k-means seed")


class PolicySFTConfig(_Section):
    """SFT baseline: behaviour cloning on successful offline train-split trajectories."""

    policies: tuple[Literal["expert", "noisy", "random"], ...] = Field(
        ("expert",),
        description="lm policy: collecting policies whose successful episodes are cloned "
        "(the scoring policy always clones the expert)",
    )
    skip_invalid: bool = Field(True, description="drop steps whose action was inadmissible")
    max_train_examples: int | None = Field(
        None, ge=1, description="seeded subset of the SFT examples (None = all)"
    )
    eval_loss_examples: int = Field(
        32, ge=0, description="validation examples for the teacher-forced eval loss"
    )
    epochs: float = Field(1.0, gt=0, description="passes over the examples")
    max_steps: int = Field(-1, ge=-1, description="optimizer steps (-1 = use epochs)")
    max_train_minutes: float | None = Field(
        None, gt=0, description="stop training (and save) after this wall-clock budget"
    )
    learning_rate: float = Field(1e-3, gt=0)
    batch_size: int = Field(8, ge=1, description="sequences (scorer: decisions) per step")
    grad_accum: int = Field(1, ge=1, description="gradient accumulation steps")
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    weight_decay: float = Field(0.0, ge=0)
    logging_steps: int = Field(10, ge=1)
    save_steps: int = Field(100, ge=1, description="checkpoint interval (resume after a kill)")


class PolicyDPOConfig(_Section):
    """DPO baseline: preferred vs rejected actions from the same offline state."""

    max_rejected_per_state: int = Field(
        3, ge=1, description="rejected actions paired with one state's chosen action"
    )
    max_pairs: int | None = Field(None, ge=1, description="seeded subset of pairs (None = all)")
    beta: float = Field(0.1, gt=0, description="strength of the pull to the SFT reference")
    loss_type: Literal["sigmoid", "ipo", "hinge"] = Field("sigmoid", description="DPO loss")
    epochs: float = Field(1.0, gt=0, description="passes over the pairs")
    max_steps: int = Field(-1, ge=-1, description="optimizer steps (-1 = use epochs)")
    max_train_minutes: float | None = Field(
        None, gt=0, description="stop training (and save) after this wall-clock budget"
    )
    learning_rate: float = Field(1e-4, gt=0)
    batch_size: int = Field(8, ge=1, description="pairs per device step")
    grad_accum: int = Field(1, ge=1, description="gradient accumulation steps")
    warmup_ratio: float = Field(0.05, ge=0, lt=1)
    logging_steps: int = Field(10, ge=1)
    save_steps: int = Field(100, ge=1, description="checkpoint interval (resume after a kill)")


class PolicyEvalConfig(_Section):
    """Evaluation of a policy on the held-out real test tasks.

    Every training seed's policy plays every test task once sampled (the headline, with
    the seed as sampling seed) and, with ``greedy``, once greedily.
    """

    temperature: float = Field(
        1.0, gt=0, description="sampling temperature of the headline (sampled) episodes"
    )
    greedy: bool = Field(True, description="also play every task greedily and report it")
    max_new_tokens: int = Field(64, ge=8, description="generation cap per decision")
    gen_batch_size: int = Field(16, ge=1, description="prompts per generate call")
    parallel_envs: int = Field(8, ge=1, description="episodes stepped together (one env each)")


class ScorerConfig(_Section):
    """The command-scoring policy (agent.policy = scorer): frozen encoder + small head."""

    embedder: Literal["wordllama", "minilm"] = Field(
        "wordllama", description="frozen text encoder (packaged weights, no download)"
    )
    dim: int = Field(128, ge=16, description="embedding width kept (Matryoshka truncation)")
    hidden: int = Field(256, ge=8, description="width of the scoring head")
    design: Literal["full", "embeddings"] = Field(
        "full",
        description="full: embeddings + the agent's episode memory (instruction pointer, "
        "rooms and commands tried); embeddings: text embeddings only",
    )


class AgentConfig(_Section):
    """The agent policy: base model, prompt shape, SFT/DPO baselines and evaluation."""

    policy: Literal["scorer", "lm"] = Field(
        "scorer",
        description="scorer: softmax over admissible commands scored by a small head on a "
        "frozen encoder (cpu); lm: a causal LM answering <think>/<action> (gpu)",
    )
    seeds: tuple[int, ...] = Field(
        (0,), min_length=1, description="training seeds of every policy method (Table 1)"
    )
    workers: int = Field(2, ge=1, description="seeds trained / evaluated in parallel processes")
    scorer: ScorerConfig = ScorerConfig()
    model: str = Field(
        "tiny", description="tiny (from a config) | smollm2 (packaged GGUF) | hub name/path"
    )
    tiny_preset: Literal["nano", "micro", "mini", "small"] = Field(
        "micro", description="size preset of the from-scratch model (model=tiny)"
    )
    vocab_size: int = Field(2048, ge=300, description="BPE vocabulary trained for model=tiny")
    history_len: int = Field(2, ge=0, description="previous (action, feedback) steps shown")
    with_reasoning: bool = Field(True, description="answer <think>...</think> before <action>")
    show_admissible: bool = Field(True, description="show the admissible actions, if known")
    max_admissible: int = Field(40, ge=1, description="admissible actions shown at most")
    max_length: int = Field(
        1024, ge=64, description="max prompt+answer tokens; longer examples are dropped"
    )
    bf16: bool | None = Field(
        None, description="bf16 autocast (None = on a CUDA GPU that supports it)"
    )
    lora: bool = Field(False, description="train LoRA adapters (merged before saving)")
    lora_r: int = Field(16, ge=1)
    lora_alpha: int = Field(32, ge=1)
    seed: int = Field(0, description="data subsets, init and training seed")
    sft: PolicySFTConfig = PolicySFTConfig()
    dpo: PolicyDPOConfig = PolicyDPOConfig()
    eval: PolicyEvalConfig = PolicyEvalConfig()


class RLAlgoConfig(_Section):
    """Settings shared by multi-turn GRPO and PPO (components/agent/rl.py)."""

    iterations: int = Field(10, ge=0, description="rollout + update rounds in total (resumable)")
    tasks_per_iteration: int = Field(4, ge=1, description="distinct tasks per round")
    rollouts_per_task: int = Field(4, ge=1, description="episodes per task per round (GRPO: n)")
    learning_rate: float = Field(1e-5, gt=0, description="AdamW learning rate of the policy")
    weight_decay: float = Field(0.0, ge=0, description="AdamW weight decay")
    beta: float = Field(0.001, ge=0, description="KL coefficient to the reference (0 = none)")
    entropy_coef: float = Field(
        0.0, ge=0, description="entropy bonus per completion token (0 = none)"
    )
    kl_ratio_correction: bool = Field(
        True, description="weight the k3 KL by the ratio (samples are old-policy; TRL default)"
    )
    clip_low: float = Field(0.2, gt=0, lt=1, description="ratio clip below 1 (1 - clip_low)")
    clip_high: float = Field(0.2, gt=0, description="ratio clip above 1 (DAPO: 0.28)")
    epochs: int = Field(1, ge=1, description="passes over each rollout batch")
    minibatch_size: int | None = Field(
        None, ge=1, description="turns per optimizer step (null = whole batch, one step/epoch)"
    )
    micro_batch_size: int = Field(8, ge=1, description="turns per forward pass (memory only)")
    aggregation: Literal["token", "sequence"] = Field(
        "token", description="token: mean over completion tokens; sequence: mean of turn means"
    )
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping (global norm)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (log-probs too)")
    max_new_tokens: int = Field(64, ge=1, description="completion token cap per decision")
    max_turns: int | None = Field(
        None, ge=1, description="safety cap on turns per episode (the env's limit comes first)"
    )
    max_real_steps: int | None = Field(
        None, ge=0, description="stop after the round that reaches this real-step budget"
    )
    save_every: int = Field(5, ge=1, description="checkpoint every N rounds (and at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept on disk")
    max_train_minutes: float | None = Field(
        None, gt=0, description="stop (after a checkpoint) once this wall-clock budget is spent"
    )
    task_sampling: Literal["uniform", "variance"] = Field(
        "variance",
        description="uniform: a seeded sample of the train tasks per round; variance: tasks "
        "weighted by the reward variance of their recent rollouts (components/curriculum)",
    )
    seed: int = Field(0, description="task sampling, sampling and shuffling seed (per run)")
    seeds: list[int] | None = Field(
        None,
        min_length=1,
        description="training seeds of this algorithm's runs (real, DreamGym, S2R), a subset "
        "of agent.seeds (each starts from that seed's SFT policy); null = agent.seeds",
    )


class GRPOConfig(RLAlgoConfig):
    """Multi-turn GRPO: group-relative outcome advantages (components/agent/grpo.py)."""

    rollouts_per_task: int = Field(4, ge=2, description="the group size n (>= 2)")
    scale_rewards: bool = Field(True, description="divide centred rewards by the group's std")
    drop_zero_std_groups: bool = Field(
        True, description="skip groups whose rewards are all equal (no signal; DAPO's filter)"
    )


class PPOConfig(RLAlgoConfig):
    """Multi-turn PPO: value head, GAE over turns (components/agent/ppo.py)."""

    rollouts_per_task: int = Field(1, ge=1, description="episodes per task per round")
    epochs: int = Field(2, ge=1, description="passes over each rollout batch")
    minibatch_size: int | None = Field(16, ge=1, description="turns per optimizer step")
    gamma: float = Field(1.0, ge=0, le=1, description="discount per turn")
    lam: float = Field(0.95, ge=0, le=1, description="GAE lambda")
    vf_coef: float = Field(0.5, ge=0, description="weight of the value loss")
    value_clip: float = Field(0.2, gt=0, description="clip of V around the old value")
    value_learning_rate: float = Field(1e-3, gt=0, description="learning rate of the value head")
    normalize_advantages: bool = Field(
        True, description="standardise advantages (within groups when grouped)"
    )


class RLConfig(_Section):
    """Agent RL (GRPO and PPO), real or synthetic env."""

    grpo: GRPOConfig = GRPOConfig()
    ppo: PPOConfig = PPOConfig()
    s2r_real_fraction: float = Field(
        0.1,
        ge=0,
        le=1,
        description="sim-to-real cap: this share of the real steps the real-env run used",
    )
    s2r_tasks_per_iteration: int | None = Field(
        None, ge=1, description="sim-to-real rounds' task batch (None: the algorithm's own)"
    )
    dreamgym_iterations: int | None = Field(
        None,
        ge=1,
        description="rounds of RL in the synthetic env (None: the algorithm's own); synthetic "
        "steps cost no real interaction and ~10x less time",
    )


class JudgeConfig(_Section):
    """Judge of synthetic trajectories: the paper's four criteria on a 0/1/2 rubric."""

    backend: Literal["grounded", "openai"] = Field(
        "grounded", description="grounded: replay in the real simulator (offline); openai: LLM"
    )
    n_trajectories: int = Field(100, ge=1, description="seeded sample judged per variant")
    seed: int = Field(0, description="sampling seed")
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
    seed: int = Field(0, description="subsampling seed")


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
        None, ge=2, description="measure the first N rounds only (None: every round)"
    )
    max_trajectories: int = Field(
        16, ge=1, description="synthetic trajectories per round replayed for eps_R and eps_P"
    )


class PromotionConfig(_Section):
    """When a registered candidate model replaces the champion (components/evaluation)."""

    margin: float = Field(
        0.02, ge=0, description="the candidate must beat the champion's held-out metric by this"
    )
    policy_metric: str = Field("success", description="held-out metric of the policy")
    experience_metric: str = Field(
        "reward_accuracy",
        description="held-out metric of the experience model (reward_accuracy has a 95% CI)",
    )


class Config(_Section):
    """The whole validated configuration of one profile."""

    profile: Literal["ci", "cpu", "gpu"]
    seed: int = 0
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
    promotion: PromotionConfig = PromotionConfig()

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


def _format_errors(err: ValidationError, source: str) -> str:
    # one line: a CLI error is a single line on stderr, each problem naming its key
    problems = []
    for e in err.errors():
        key = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = "unknown key" if e["type"] == "extra_forbidden" else e["msg"]
        value = e.get("input")
        if e["type"] != "extra_forbidden" and isinstance(value, str | int | float | bool):
            shown = repr(value)
            msg += f" (got {shown if len(shown) <= 40 else shown[:37] + '...'})"
        problems.append(f"{key}: {msg}")
    return f"invalid configuration ({source}): " + "; ".join(problems)


def resolve_params(raw: dict[str, Any], profile: str | None = None) -> dict[str, Any]:
    """Merge the active profile's overlay over the defaults; returns plain data."""
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
    merged = _deep_merge(raw, profiles.get(name) or {})
    merged["profile"] = name
    return merged


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


def load_config(path: str | Path = PARAMS_FILE, profile: str | None = None) -> Config:
    """Load params.yaml, apply the profile overlay and validate everything."""
    path = Path(path)
    raw = _read_params(path)
    if profile is not None and profile not in PROFILES:  # --profile, not the file's fault
        raise ConfigError(f"--profile: unknown profile '{profile}'; known: {list(PROFILES)}")
    try:
        active = resolve_params(raw, profile)["profile"]
        # Validate every profile, not only the active one, so a typo in the gpu overlay is
        # caught on the laptop rather than on the expensive machine.
        configs = {}
        for name in PROFILES:
            merged = resolve_params(raw, name)
            try:
                configs[name] = Config.model_validate(merged)
            except ValidationError as err:
                raise ConfigError(_format_errors(err, f"{path}, profile '{name}'")) from None
    except ConfigError as err:
        # `dvc exp run -S key=value` writes params.yaml before any stage runs and does not
        # undo it when the stage fails: say how to get the committed file back
        raise ConfigError(
            f"{err} (if `dvc exp run -S` wrote this, restore it: git checkout {path})"
        ) from None
    return configs[active]
