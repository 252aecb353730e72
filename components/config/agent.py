"""Sections of the agent policy: SFT/DPO baselines, evaluation, scorer, RL (GRPO, PPO)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator

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


class PolicySFTConfig(_Section):
    """SFT baseline: behaviour cloning on successful offline train-split trajectories."""

    policies: tuple[Literal["expert", "noisy", "random"], ...] = Field(
        ("expert",),
        description="lm policy: collecting policies whose successful episodes are cloned "
        "(the scoring policy always clones the expert)",
    )
    skip_invalid: bool = Field(
        True,
        description="drop steps whose action was inadmissible (LM policy only: the scoring "
        "policy always drops them)",
    )
    max_train_examples: int | None = Field(
        None, ge=1, description="seeded subset of the SFT examples (None = all) (LM policy only)"
    )
    eval_loss_examples: EvalLossExamples = Field(
        32, description="validation examples for the teacher-forced eval loss (LM policy only)"
    )
    epochs: float = Field(20.0, gt=0, description="passes over the examples")
    max_steps: OptimizerSteps = Field(
        -1, description="optimizer steps (-1 = use epochs) (LM policy only)"
    )
    max_train_minutes: TrainMinutes = Field(
        None, description="stop training (and save) after this wall-clock budget (LM policy only)"
    )
    learning_rate: LearningRate = 1e-3
    batch_size: int = Field(64, ge=1, description="sequences (scorer: decisions) per step")
    grad_accum: GradAccum = Field(1, description="gradient accumulation steps (LM policy only)")
    warmup_ratio: WarmupRatio = Field(
        0.05, description="share of the steps warming the learning rate up (LM policy only)"
    )
    weight_decay: WeightDecay = 0.0
    logging_steps: LoggingSteps = Field(
        10, description="steps between logged losses (LM policy only)"
    )
    save_steps: SaveSteps = Field(
        100, description="checkpoint interval (resume after a kill) (LM policy only)"
    )


class PolicyDPOConfig(_Section):
    """DPO baseline: preferred vs rejected actions from the same offline state."""

    max_rejected_per_state: int = Field(
        3, ge=1, description="rejected actions paired with one state's chosen action"
    )
    max_pairs: int | None = Field(None, ge=1, description="seeded subset of pairs (None = all)")
    beta: float = Field(0.1, gt=0, description="strength of the pull to the SFT reference")
    loss_type: Literal["sigmoid", "ipo", "hinge"] = Field("sigmoid", description="DPO loss")
    sft_weight: float = Field(
        1.0,
        ge=0,
        description="weight of the chosen action's negative log-likelihood added to the DPO "
        "loss (RPO; TRL loss_type 'sft'): without it DPO can lower the chosen action too and "
        "move probability to actions no pair holds (0: plain DPO)",
    )
    epochs: float = Field(5.0, gt=0, description="passes over the pairs")
    max_steps: OptimizerSteps = Field(
        -1, description="optimizer steps (-1 = use epochs) (LM policy only)"
    )
    max_train_minutes: TrainMinutes = Field(
        None, description="stop training (and save) after this wall-clock budget (LM policy only)"
    )
    learning_rate: LearningRate = 3e-4
    batch_size: int = Field(64, ge=1, description="pairs per device step")
    grad_accum: GradAccum = Field(1, description="gradient accumulation steps (LM policy only)")
    warmup_ratio: WarmupRatio = Field(
        0.05, description="share of the steps warming the learning rate up (LM policy only)"
    )
    logging_steps: LoggingSteps = Field(
        10, description="steps between logged losses (LM policy only)"
    )
    save_steps: SaveSteps = Field(
        100, description="checkpoint interval (resume after a kill) (LM policy only)"
    )


class PolicyEvalConfig(_Section):
    """Evaluation of a policy on the held-out real test tasks.

    Every training seed's policy plays every test task ``passes`` times sampled (the
    headline; pass p samples with seed + 1000 p) and, with ``greedy``, once greedily.
    """

    temperature: float = Field(
        1.0, gt=0, description="sampling temperature of the headline (sampled) episodes"
    )
    passes: int = Field(
        3,
        ge=1,
        description="sampled passes over the test tasks per training seed (more passes: "
        "a tighter CI on the same games; a (task, seed)'s passes are averaged)",
    )
    greedy: bool = Field(True, description="also play every task greedily and report it")
    max_new_tokens: int = Field(64, ge=8, description="generation cap per decision")
    gen_batch_size: int = Field(16, ge=1, description="prompts per generate call")
    parallel_envs: int = Field(32, ge=1, description="episodes stepped together (one env each)")


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
    seeds: tuple[Seed, ...] = Field(
        (0, 1, 2), min_length=1, description="training seeds of every policy method (Table 1)"
    )

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: Any) -> Any:
        return _distinct(seeds)

    workers: int = Field(
        4,
        ge=1,
        description="seeds trained / evaluated in parallel processes (the RL stages: both "
        "algorithms' seeds in one pool)",
    )
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
    bf16: Bf16 = None
    lora: UseLoRA = False
    lora_r: LoRARank = 16
    lora_alpha: LoRAAlpha = 32
    gradient_checkpointing: bool = Field(
        True,
        description="LM policy RL updates recompute activations in the backward pass "
        "(SmolLM2, 16 turns of 700 tokens on CPU: 6.2 GB instead of 19.0 GB, ~10% slower)",
    )
    seed: Seed = Field(0, description="data subsets, init and training seed")
    sft: PolicySFTConfig = PolicySFTConfig()
    dpo: PolicyDPOConfig = PolicyDPOConfig()
    eval: PolicyEvalConfig = PolicyEvalConfig()


class RLAlgoConfig(_Section):
    """Settings shared by multi-turn GRPO and PPO (components/agent/rl.py)."""

    iterations: int = Field(24, ge=1, description="rollout + update rounds in total (resumable)")
    tasks_per_iteration: int = Field(32, ge=1, description="distinct tasks per round")
    rollouts_per_task: int = Field(4, ge=1, description="episodes per task per round (GRPO: n)")
    learning_rate: float = Field(3e-4, gt=0, description="AdamW learning rate of the policy")
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
    epochs: int = Field(4, ge=1, description="passes over each rollout batch")
    minibatch_size: int | None = Field(
        256, ge=1, description="turns per optimizer step (null = whole batch, one step/epoch)"
    )
    micro_batch_size: int = Field(
        256,
        ge=1,
        description="turns per forward pass (memory only); the policy's own scoring batch "
        "caps it (scorer 256, LM policy 16)",
    )
    aggregation: Literal["token", "sequence", "episode"] = Field(
        "token",
        description="token: mean over completion tokens; sequence: mean of turn means; "
        "episode: mean of turn means with every episode weighted equally, however many turns "
        "it took (GRPO's per-sample mean; a long failed episode does not outweigh the "
        "successes of its group)",
    )
    max_grad_norm: float = Field(1.0, gt=0, description="gradient clipping (global norm)")
    temperature: float = Field(1.0, gt=0, description="sampling temperature (log-probs too)")
    max_new_tokens: int = Field(48, ge=1, description="completion token cap per decision")
    max_turns: int | None = Field(
        None, ge=1, description="safety cap on turns per episode (the env's limit comes first)"
    )
    max_real_steps: int | None = Field(
        None, ge=0, description="stop after the round that reaches this real-step budget"
    )
    save_every: int = Field(4, ge=1, description="checkpoint every N rounds (and at the end)")
    keep_checkpoints: int = Field(2, ge=1, description="checkpoints kept on disk")
    max_train_minutes: float | None = Field(
        None, gt=0, description="stop (after a checkpoint) once this wall-clock budget is spent"
    )
    task_sampling: Literal["uniform", "variance"] = Field(
        "variance",
        description="uniform: a seeded sample of the train tasks per round; variance: tasks "
        "weighted by the reward variance of their recent rollouts (components/curriculum)",
    )
    sft_coef: float = Field(
        0.0,
        ge=0,
        description="weight of a behaviour-cloning term added to every minibatch: the "
        "cross-entropy of the expert's command on a batch of the train split's real expert "
        "steps (InstructGPT's PPO-ptx idea; offline data, no env step; scorer policy; 0 = off)",
    )
    sft_batch_size: int = Field(64, ge=1, description="expert steps per minibatch's SFT term")
    seed: Seed = Field(0, description="task sampling, sampling and shuffling seed (per run)")
    seeds: list[Seed] | None = Field(
        None,
        min_length=1,
        description="training seeds of this algorithm's runs (real, DreamGym, S2R), a subset "
        "of agent.seeds (each starts from that seed's SFT policy); null = agent.seeds",
    )

    @field_validator("seeds")
    @classmethod
    def _distinct_seeds(cls, seeds: Any) -> Any:
        return _distinct(seeds)


class GRPOConfig(RLAlgoConfig):
    """Multi-turn GRPO: group-relative outcome advantages (components/agent/grpo.py)."""

    rollouts_per_task: int = Field(4, ge=2, description="the group size n (>= 2)")
    scale_rewards: bool = Field(True, description="divide centred rewards by the group's std")
    drop_zero_std_groups: bool = Field(
        True, description="skip groups whose rewards are all equal (no signal; DAPO's filter)"
    )


class PPOConfig(RLAlgoConfig):
    """Multi-turn PPO: value head, GAE over turns (components/agent/ppo.py)."""

    iterations: int = Field(20, ge=1, description="rollout + update rounds in total (resumable)")
    tasks_per_iteration: int = Field(128, ge=1, description="distinct tasks per round")
    rollouts_per_task: int = Field(1, ge=1, description="episodes per task per round")
    epochs: int = Field(2, ge=1, description="passes over each rollout batch")
    seeds: list[Seed] | None = Field(
        [0],
        min_length=1,
        description="training seeds of PPO's runs (real, DreamGym, S2R), a subset of "
        "agent.seeds; null = agent.seeds",
    )
    gamma: float = Field(0.99, ge=0, le=1, description="discount per turn")
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
    s2r_mode: Literal["reground", "real_rl"] = Field(
        "reground",
        description="what sim-to-real spends its real steps on: reground (rollouts of the "
        "DreamGym policy on real train games join the experience model's real data, then the "
        "policy continues for s2r_dream_iterations rounds in the re-grounded dream) or "
        "real_rl (the DreamGym policy continues with GRPO/PPO on real games)",
    )
    s2r_probe_passes: int | None = Field(
        1,
        ge=1,
        description="reground: passes of one probe episode per train task, within the cap "
        "(None: passes until the cap is spent)",
    )
    s2r_explore: bool = Field(
        False,
        description="reground: after the probes, the rest of the cap walks each train game's "
        "real map to the exits no recorded episode took (components/stages/exploration.py), "
        "and the re-grounded model is fit on those walks too",
    )
    s2r_dream_iterations: int | None = Field(
        None,
        ge=1,
        description="reground: rounds of RL in the re-grounded dream (None: DreamGym's own, "
        "dreamgym_iterations)",
    )
    s2r_tasks_per_iteration: int | None = Field(
        8, ge=1, description="sim-to-real rounds' task batch (None: the algorithm's own)"
    )
    s2r_aggregation: Literal["token", "sequence", "episode"] | None = Field(
        "episode",
        description="s2r_mode real_rl: the real rounds' policy-loss aggregation (None: the "
        "algorithm's own); episode keeps a strong start's few long failures from outweighing "
        "its successes. reground's dream phase takes DreamGym's settings",
    )
    s2r_task_prior: Literal["none", "synthetic"] = Field(
        "none",
        description="s2r_mode real_rl: the real rounds' task sampler's start: none (every "
        "task uncertain) or "
        "synthetic (each train task's success in the seed's own DreamGym episodes, so the "
        "first real rounds go where the dream was uncertain)",
    )
    dreamgym_tasks_per_iteration: int | None = Field(
        None,
        ge=1,
        description="DreamGym rounds' task batch (None: the algorithm's own); a synthetic "
        "episode holds no simulator, so rounds can be larger than an env's real ones",
    )
    dreamgym_iterations: int | None = Field(
        72,
        ge=1,
        description="rounds of RL in the synthetic env (None: the algorithm's own); synthetic "
        "steps cost no real interaction and ~10x less time",
    )


def _distinct(seeds: Any) -> Any:
    """A repeated seed would count its episodes twice in every CI."""
    if seeds is not None and len(set(seeds)) != len(seeds):
        raise ValueError(f"a seed is listed twice: {list(seeds)}")
    return seeds
