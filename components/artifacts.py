"""One home for artifact names and locations: methods, ablation variants and their paths.

Every model, checkpoint, snapshot and metrics path the stages, flows and bench share is
built here from a ``Paths`` root, a method (``sft``, ``grpo_real``, ``dreamgym_ppo`` ...),
an experience-model variant or an RL algorithm, and optionally a training seed. dvc.yaml
names the same locations; tests/unit/test_artifacts.py pins the layout.
"""

from __future__ import annotations

from pathlib import Path

from components.config.loading import Paths

# Table-1 methods: the baselines and the RL run kinds x algorithms
SFT, DPO, RANDOM = "sft", "dpo", "random"
GRPO, PPO = "grpo", "ppo"
ALGOS = (GRPO, PPO)
REAL, DREAMGYM, S2R = "real", "dreamgym", "s2r"

# experience-model ablation variants: the pipeline's model ("full") and one switch each
FULL, NO_REASONING, NO_HISTORY, NO_REPLAY = "full", "no_reasoning", "no_history", "no_replay"
VARIANTS = (FULL, NO_REASONING, NO_HISTORY, NO_REPLAY)

MODELS_DIR = "models"
SEED_DIR = "seed-{seed}"
EVAL_DIR = "eval"  # metrics/eval/<method>.json and data/eval/<method>.jsonl
AGENT_DIR = "agent"  # metrics/agent/<method>.json (training)
HISTORY_DIR = "history"  # metrics/history/<method>.jsonl: the RL training curves
SYNTHETIC_DIR = "synthetic"  # data/synthetic/dreamgym_<algo>.jsonl
COEVOLVED_DIR = "coevolved"  # data/coevolved/dreamgym_<algo>/seed-<s>


def checked_algo(algo: str) -> str:
    if algo not in ALGOS:
        raise ValueError(f"unknown RL algorithm {algo!r}; known: {ALGOS}")
    return algo


def checked_variant(variant: str) -> str:
    if variant not in VARIANTS:
        raise ValueError(f"unknown variant {variant!r}; known: {VARIANTS}")
    return variant


def real_method(algo: str) -> str:
    """Table-1 name of RL in the real env."""
    return f"{checked_algo(algo)}_real"


def dreamgym_method(algo: str) -> str:
    """Table-1 name of RL in the synthetic env."""
    return f"dreamgym_{checked_algo(algo)}"


def s2r_method(algo: str) -> str:
    """Table-1 name of sim-to-real."""
    return f"s2r_{checked_algo(algo)}"


def method_of(kind: str, algo: str) -> str:
    """The method name of a run kind (real, dreamgym, s2r) and algorithm."""
    return {REAL: real_method, DREAMGYM: dreamgym_method, S2R: s2r_method}[kind](algo)


# Table 1's rows, in order: the random-admissible baseline, the offline baselines, then
# each RL run kind over both algorithms
METHODS = (
    RANDOM,
    SFT,
    DPO,
    *(real_method(a) for a in ALGOS),
    *(dreamgym_method(a) for a in ALGOS),
    *(s2r_method(a) for a in ALGOS),
)


def seed_dir(method_dir: Path, seed: int) -> Path:
    """The directory of one training seed of a method."""
    return Path(method_dir) / SEED_DIR.format(seed=seed)


def _per_seed(base: Path, seed: int | None) -> Path:
    return base if seed is None else seed_dir(base, seed)


# experience model


def experience_model_dir(paths: Paths, variant: str = FULL) -> Path:
    """Where a trained experience model is saved (a DVC output per variant)."""
    return paths.root / MODELS_DIR / "experience" / checked_variant(variant)


def experience_checkpoint_dir(paths: Paths, variant: str = FULL) -> Path:
    """Training checkpoints (outside the DVC output, so a re-run can resume)."""
    return paths.root / MODELS_DIR / "checkpoints" / "experience" / checked_variant(variant)


def base_cache_dir(paths: Paths) -> Path:
    """Cache of converted base models (SmolLM2 safetensors)."""
    return paths.root / MODELS_DIR / "base"


# policies


def policy_dir(paths: Paths, method: str, seed: int | None = None) -> Path:
    """Where a method's policies are saved, one ``seed-<s>`` directory each (DVC output)."""
    return _per_seed(paths.root / MODELS_DIR / "policy" / method, seed)


def policy_checkpoint_dir(paths: Paths, method: str, seed: int | None = None) -> Path:
    """Training checkpoints of a method (outside the DVC output, so a re-run can resume)."""
    return _per_seed(paths.root / MODELS_DIR / "checkpoints" / "policy" / method, seed)


def snapshots_dir(paths: Paths, method: str, seed: int | None = None) -> Path:
    """Every round's policy weights of a run (``theorem1.snapshots``), per seed."""
    return _per_seed(paths.root / MODELS_DIR / "snapshots" / method, seed)


# metrics and data of a method


def eval_file(paths: Paths, method: str) -> Path:
    """The evaluation summary of a method on the held-out test tasks."""
    return paths.metrics / EVAL_DIR / f"{method}.json"


def episodes_file(paths: Paths, method: str) -> Path:
    """The evaluation episodes of a method (one JSON row per task, seed and mode)."""
    return paths.data / EVAL_DIR / f"{method}.jsonl"


def agent_metrics_file(paths: Paths, method: str) -> Path:
    """The training summary of a method."""
    return paths.metrics / AGENT_DIR / f"{method}.json"


def history_file(paths: Paths, method: str) -> Path:
    """The per-round training history of a method, one JSON row per (seed, round)."""
    return paths.metrics / HISTORY_DIR / f"{method}.jsonl"


def history_plot_file(paths: Paths, method: str) -> Path:
    """The same history as one JSON array: the DVC plot (DVC cannot parse JSON Lines)."""
    return paths.metrics / HISTORY_DIR / f"{method}.json"


def synthetic_dir(paths: Paths) -> Path:
    """Synthetic trajectories written by the DreamGym stages (one JSONL per algorithm)."""
    return paths.data / SYNTHETIC_DIR


def synthetic_file(paths: Paths, algo: str, seed: int | None = None) -> Path:
    """The synthetic trajectories a DreamGym run trained on (every seed, or one seed's)."""
    method = dreamgym_method(algo)
    if seed is None:
        return synthetic_dir(paths) / f"{method}.jsonl"
    return synthetic_dir(paths) / method / f"{SEED_DIR.format(seed=seed)}.jsonl"


def coevolved_dir(paths: Paths, algo: str, seed: int | None = None) -> Path:
    """The co-evolved replay buffer of a DreamGym run, per seed."""
    return _per_seed(paths.data / COEVOLVED_DIR / dreamgym_method(algo), seed)
