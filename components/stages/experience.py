"""Stage train_experience_model: fit the experience model and register it.

``train_experience_model`` builds SFT examples (train split, neighbours retrieved from the
replay buffer's seed version), fine-tunes the base model named by ``experience.model``
(or fits the cpu profile's grounded model), saves it to models/experience and registers it
as ``experience-model@candidate``. Its fidelity is measured by components/stages/fidelity.py.
Heavy imports stay inside the functions.
"""

from __future__ import annotations

import hashlib
import json
import logging
import random
import shutil
import time
from pathlib import Path
from typing import Any

from components.artifacts import (
    NO_REASONING,
    VARIANTS,
    base_cache_dir,
    checked_variant,
    experience_checkpoint_dir,
    experience_model_dir,
)
from components.config import Config, ConfigError, ExperienceConfig, Paths
from components.config.experience import GROUNDED_MODEL
from components.experience.dataset import (
    ExperienceExample,
    PromptSettings,
    Retriever,
    settings_for,
)
from components.io import swap_dir
from components.schema import Trajectory, read_jsonl
from components.stages.common import numbers, write_json

log = logging.getLogger("dreamgym")
TRAINED_ON = "trained_on.json"  # in each model folder: the data it was fitted on


def mark_trained_on(model_dir: Path, paths: Paths) -> None:
    """Record in ``model_dir`` which trajectories file (its md5) the model was fitted on."""
    from components.tracking import dvc_md5

    mark = {"trajectories": dvc_md5(paths.trajectories_file)}
    (model_dir / TRAINED_ON).write_text(json.dumps(mark) + "\n", encoding="utf-8")


def evaluable_variants(paths: Paths) -> list[str]:
    """The experience-model variants present and fitted on the same data as ``full``.

    A variant is trained by hand (``train-experience-model --variant``), outside DVC's
    graph: one fitted on older trajectories would be scored beside ``full`` as if it were
    an ablation of it, so it is left out, with a warning saying how to refresh it."""
    present = [v for v in VARIANTS if experience_model_dir(paths, v).exists()]
    if "full" not in present:
        return present

    def trained_on(variant: str) -> Any:
        mark = experience_model_dir(paths, variant) / TRAINED_ON
        return json.loads(mark.read_text(encoding="utf-8")) if mark.exists() else None

    full = trained_on("full")
    if full is None:  # a model of an older version: nothing to compare with
        return present
    stale = [v for v in present if v != "full" and trained_on(v) != full]
    for v in stale:
        log.warning(
            "experience model %s was fitted on other trajectories than full: left out "
            "(refresh it: dreamgym train-experience-model --variant %s)",
            v,
            v,
        )
    return [v for v in present if v not in stale]


REGISTERED_MODEL = "experience-model"
CANDIDATE_ALIAS = "candidate"
EXPERIENCE_METRICS_DIR = "experience"
_NOT_IN_FINGERPRINT = {
    "max_train_minutes",
    "logging_steps",
    "save_steps",
    "eval_examples",
    "max_new_tokens",
    "gen_batch_size",
    "temperature",
}


def prompt_settings(cfg: Config, variant: str = "full") -> PromptSettings:
    """The prompt shape after the pipeline's ablation switches and the variant's own."""
    return settings_for(
        cfg.experience.history_len,
        cfg.buffer.k,
        no_history=cfg.ablation.no_history or variant == "no_history",
        no_replay=cfg.ablation.no_replay or variant == "no_replay",
        no_reasoning=cfg.ablation.no_reasoning or checked_variant(variant) == "no_reasoning",
        state_target=cfg.experience.state_target,
    )


def open_retriever(cfg: Config, paths: Paths, k: int) -> Retriever | None:
    """Buffer-backed retrieval (seed version when tagged), or None when k = 0."""
    if k == 0:
        return None
    from components.buffer import SEED_TAG, BufferVersionError, ReplayBuffer
    from components.experience.dataset import buffer_retriever

    path = paths.buffer
    if not path.exists():
        raise FileNotFoundError(
            f"{path} missing: run `dreamgym build-buffer` (or set ablation.no_replay=true)"
        )
    buf = ReplayBuffer.open(path, cfg.buffer, create=False)
    try:
        # the seed version holds the real train transitions only: later synthetic rows
        # must not change the experience model's training data
        buf.checkout(SEED_TAG)
    except BufferVersionError:
        log.warning("buffer has no %r tag: retrieving from its latest version", SEED_TAG)
    return buffer_retriever(buf, env=cfg.env.name)


def llm_dream_env(cfg: Config, paths: Paths, mdir: Path, index: Any, namespace: str) -> Any:
    """The LLM experience model in ``mdir`` as a synthetic vector env, with its own prompt.

    The model ``serving`` names is decoded where it is served (a vLLM server when
    ``serving.backend`` is ``openai``, so evaluation does not load a second copy on the
    GPU); any other directory (an ablation variant) is loaded locally. Retrieval reads the
    buffer's seed version, as in training.
    """
    from components.experience.sft import load_meta
    from components.experience.synthetic_env import VectorSyntheticEnv
    from components.lm.serving import OPENAI, experience_backend, local_model_dir

    meta = load_meta(mdir)
    served = local_model_dir(cfg.serving, paths.root).resolve() == Path(mdir).resolve()
    if cfg.serving.backend == OPENAI and served:
        backend = experience_backend(cfg.serving, paths.root)
    else:
        from components.lm.generate import Generator
        from components.lm.models import load_pretrained_dir

        backend = Generator(*load_pretrained_dir(mdir))
    retriever = open_retriever(cfg, paths, PromptSettings(**meta["prompt"]).k)
    return VectorSyntheticEnv.from_config(
        cfg, backend, index, retriever=retriever, meta=meta, namespace=namespace
    )


def load_trajectories(paths: Paths) -> list[Trajectory]:
    """Every ingested trajectory (data/ingested/trajectories.jsonl), all splits."""
    if not paths.trajectories_file.exists():
        raise FileNotFoundError(f"{paths.trajectories_file} missing: run `dreamgym ingest`")
    return list(read_jsonl(paths.trajectories_file, Trajectory))


def _examples_digest(examples: list[ExperienceExample]) -> str:
    h = hashlib.sha256()
    for ex in examples:
        h.update(json.dumps(ex.to_sft(), sort_keys=True).encode("utf-8"))
    return h.hexdigest()[:16]


def load_base_model(
    ecfg: ExperienceConfig,
    train: list[ExperienceExample],
    base_cache: Path,
    tokenizer_dir: Path,
) -> tuple[Any, Any]:
    """The base model and tokenizer named by ``experience.model``.

    ``tiny`` trains its tokenizer on the train examples (train split only) and keeps it in
    ``tokenizer_dir`` (next to the checkpoints: a resumed run needs the same vocabulary).
    """
    from components.experience.dataset import corpus
    from components.lm.models import load_base

    return load_base(
        ecfg, lambda: corpus(train), base_cache=base_cache, tokenizer_dir=tokenizer_dir
    )


GROUNDED = GROUNDED_MODEL  # the cpu profile's model (components/experience/grounded.py)


def grounded_settings(cfg: Config, variant: str) -> Any:
    """The grounded model's switches after the pipeline's ablations and the variant's own."""
    from components.experience.grounded import GroundedSettings

    return GroundedSettings(
        replay=not (cfg.ablation.no_replay or variant == "no_replay"),
        history=not (cfg.ablation.no_history or variant == "no_history"),
        seed=cfg.experience.seed,
    )


def register_experience_model(run: Any, cfg: Config, out: Path, base_model: str) -> str:
    """Register ``out`` as a pyfunc ``experience-model@candidate`` (ablation runs: apart)."""
    from components.evaluation.promotion import registry_target
    from components.model_registry import register_model_dir

    # an ablation experiment registers under experience-model-ablation, with no alias
    name, aliases, extra = registry_target(
        REGISTERED_MODEL, (CANDIDATE_ALIAS,), cfg.ablation.model_dump()
    )
    version = register_model_dir(
        run,
        out,
        name,
        aliases=aliases,
        # promotion compares held-out figures of one env and profile only
        tags={"base_model": base_model, "profile": cfg.profile, "env": cfg.env.name, **extra},
        kind="experience",  # loads with mlflow.pyfunc.load_model("models:/...")
    )
    run.set_tags({"registered_model": f"{name}/{version}"})
    return version


def train_grounded(cfg: Config, paths: Paths, variant: str) -> dict[str, Any]:
    """Fit the grounded experience model on real train trajectories, save and register."""
    from components.experience.grounded import GroundedModel
    from components.tracking import stage_run

    if cfg.ablation.no_reasoning or variant == NO_REASONING:
        # its "reasoning" only names the evidence: the ablation would rerun the pipeline and
        # change nothing (a check here, not in the config: every profile is validated)
        raise ConfigError(
            "ablation.no_reasoning: the grounded experience model (the cpu profile's) does "
            "not reason before it predicts; the ablation needs an LLM experience model "
            "(experience.model: tiny, smollm2 or a hub model, as in -S profile=gpu)"
        )
    start = time.perf_counter()
    train = [t for t in load_trajectories(paths) if t.split == "train" and t.source == "real"]
    if not train:
        from components.io import InputError

        raise InputError(
            f"no real train-split trajectory in {paths.trajectories_file}: "
            "was every raw line quarantined (data/quarantine/)?"
        )
    settings = grounded_settings(cfg, variant)
    data = {"trajectories": paths.trajectories_file}
    stage = f"train_experience_model@{variant}"
    with stage_run(stage, "experience", cfg, ("experience", "ablation"), paths.root, data) as run:
        run.set_tags({"base_model": GROUNDED, "variant": variant})
        model = GroundedModel(settings)
        stats = model.fit(train)
        out = experience_model_dir(paths, variant)
        tmp = out.with_name(out.name + ".tmp")
        shutil.rmtree(tmp, ignore_errors=True)
        model.save(tmp)
        meta = {"base_model": GROUNDED, "variant": variant, "settings": settings.__dict__}
        # which edit each verb learned and how often it reproduces the real next state
        meta["edit_match_by_verb"] = stats.get("edit_match_by_verb", {})
        (tmp / "meta.json").write_text(json.dumps(meta, indent=2, sort_keys=True))
        mark_trained_on(tmp, paths)
        swap_dir(tmp, out)
        metrics = {**stats, "fit_seconds": round(time.perf_counter() - start, 2)}
        run.log_metrics(numbers(metrics))
        run.log_dict(meta["edit_match_by_verb"], "edits.json")
        version = None
        if variant == "full":
            version = register_experience_model(run, cfg, out, GROUNDED)
    write_json(paths.metrics / EXPERIENCE_METRICS_DIR / f"{variant}.json", numbers(metrics))
    log.info("grounded experience model (%s) fitted: %s", variant, numbers(metrics))
    return {**metrics, "registered_version": version, "model_dir": str(out)}


def train_experience_model(cfg: Config, paths: Paths, variant: str = "full") -> dict[str, Any]:
    """Stage train_experience_model: SFT on train-split transitions, save (and register).

    ``full`` is the pipeline's model (registered as experience-model@candidate, used by
    the synthetic env); the other variants switch one ablation on for the fidelity table.
    ``experience.model = grounded`` fits the cpu profile's grounded model instead.
    """
    if cfg.experience.model == GROUNDED:
        return train_grounded(cfg, paths, variant)
    from components.experience.dataset import build_examples, select_transitions
    from components.experience.sft import prepare_checkpoints, save_model, train_sft
    from components.lm.models import count_parameters
    from components.teacher.annotate import load_annotations
    from components.tracking import stage_run

    ecfg = cfg.experience
    settings = prompt_settings(cfg, variant)
    start = time.perf_counter()
    trajectories = load_trajectories(paths)
    reasoning = load_annotations(paths.annotations_file) if settings.with_reasoning else None
    if reasoning is not None and not reasoning:
        raise FileNotFoundError(f"no annotations in {paths.annotations_file}: run annotate")
    retriever = open_retriever(cfg, paths, settings.k)
    pairs = select_transitions(
        trajectories, "train", ecfg.max_train_examples, ecfg.seed, ecfg.min_success_share
    )
    train, train_stats = build_examples(pairs, settings, reasoning, retriever)
    if variant == "full" and ecfg.task_gen_examples > 0:
        # the task-generation head shares the weights (curriculum variants, initial states)
        from components.experience.task_generation import task_generation_examples
        from components.schema import Task

        if not paths.tasks_file.exists():
            raise FileNotFoundError(
                f"{paths.tasks_file} missing: run generate-tasks "
                "(or set experience.task_gen_examples=0)"
            )
        tasks = list(read_jsonl(paths.tasks_file, Task))
        head = task_generation_examples(tasks, trajectories, ecfg.seed, ecfg.task_gen_examples)
        train = [*train, *head]
        random.Random(ecfg.seed).shuffle(train)
        train_stats["task_generation_examples"] = len(head)
    eval_pairs = select_transitions(trajectories, "validation", ecfg.eval_loss_examples, ecfg.seed)
    eval_examples, _ = (
        build_examples(eval_pairs, settings, reasoning, retriever)
        if ecfg.eval_loss_examples
        else ([], {})
    )
    build_seconds = time.perf_counter() - start
    log.info("built %d train examples in %.1f s: %s", len(train), build_seconds, train_stats)
    fingerprint = {
        # what defines the trained weights; budgets and logging knobs may change on resume
        "experience": ecfg.model_dump(mode="json", exclude=_NOT_IN_FINGERPRINT),
        "prompt": settings.as_dict(),
        "examples": _examples_digest(train),
    }
    ckpt = experience_checkpoint_dir(paths, variant)
    prepare_checkpoints(ckpt, fingerprint)
    model, tokenizer = load_base_model(ecfg, train, base_cache_dir(paths), ckpt / "tokenizer")
    n_params = count_parameters(model)
    data = {
        "trajectories": paths.trajectories_file,
        "annotations": paths.annotations_file,
        "buffer": paths.buffer,
    }
    sections = ("experience", "ablation", "buffer")
    stage = f"train_experience_model@{variant}"  # the dvc.yaml stage name
    with stage_run(stage, "experience", cfg, sections, paths.root, data) as run:
        run.set_tags(
            {
                "base_model": ecfg.model,
                "prompt": json.dumps(settings.as_dict()),
                "variant": variant,
            }
        )
        model, result = train_sft(
            model,
            tokenizer,
            train,
            ecfg,
            ckpt,
            fingerprint=fingerprint,
            eval_examples=eval_examples,
        )
        meta = {
            "base_model": ecfg.model,
            "tiny_preset": ecfg.tiny_preset if ecfg.model == "tiny" else None,
            "prompt": settings.as_dict(),
            "max_length": ecfg.max_length,
            "n_parameters": n_params,
            "examples_digest": fingerprint["examples"],
            "variant": variant,
        }
        out = experience_model_dir(paths, variant)
        save_model(model, tokenizer, out, meta)
        mark_trained_on(out, paths)
        metrics: dict[str, Any] = {
            **result.metrics(),
            **{f"data_{k}": v for k, v in train_stats.items()},
            "n_parameters": n_params,
            "n_eval_loss_examples": len(eval_examples),
            "build_seconds": round(build_seconds, 2),
        }
        run.log_metrics(metrics)
        run.log_dict(result.log_history, "sft/log_history.json")
        # per-step curves (loss, learning_rate, grad_norm) at the trainer's global step
        run.log_history([h for h in result.log_history if "loss" in h], "step")
        version = None
        if variant == "full":  # ablation variants only feed the fidelity table
            version = register_experience_model(run, cfg, out, ecfg.model)
    write_json(paths.metrics / EXPERIENCE_METRICS_DIR / f"{variant}.json", numbers(metrics))
    shutil.rmtree(ckpt, ignore_errors=True)  # finished: the next run starts fresh
    log.info("experience model (%s) trained: %s", ecfg.model, result.metrics())
    return {**metrics, "registered_version": version, "model_dir": str(out)}
