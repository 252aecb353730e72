"""Stage evaluate_fidelity: how well each experience-model variant predicts the real env.

Every variant trained on the same data (components/stages/experience.py) is scored on the
same held-out validation transitions (never the test split), beside the trivial baselines
(majority-class reward, "nothing changes" next state); the full LLM model also gets
open-loop rollouts. The scores tag ``experience-model@candidate`` for the promotion rule.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from components.artifacts import experience_model_dir
from components.config import Config, Paths
from components.experience.dataset import PromptSettings
from components.schema import Trajectory
from components.stages.common import alias_tags, numbers, write_json
from components.stages.experience import (
    CANDIDATE_ALIAS,
    GROUNDED,
    REGISTERED_MODEL,
    evaluable_variants,
    load_trajectories,
    open_retriever,
)

log = logging.getLogger("dreamgym")
FIDELITY_TAGS = ("eps_R", "state_soft_match", "malformed_rate")  # rounded on the alias
FIDELITY_METRICS = "fidelity.json"


def evaluate_fidelity(cfg: Config, paths: Paths) -> dict[str, Any]:
    """Stage evaluate_fidelity: every variant on the same validation transitions.

    Single-step metrics per variant (metrics/fidelity.json, keyed by variant) and, for
    the full model, open-loop rollouts on validation episodes. Never the test split.
    """
    from components.evaluation.fidelity import worst_rows
    from components.evaluation.headline import FIDELITY_HEADLINE, HEADLINE_DIR, fidelity_headline
    from components.evaluation.promotion import (
        EXPERIENCE_FLOORS,
        HeldOutMetric,
        ablation_of,
        baseline_tags,
        metric_tags,
    )
    from components.model_registry import tag_model_alias
    from components.tracking import run_provenance, stage_run

    trajectories = load_trajectories(paths)
    present = evaluable_variants(paths)
    if "full" not in present:
        raise FileNotFoundError(
            f"{experience_model_dir(paths)} missing: run train-experience-model"
        )
    data = {"trajectories": paths.trajectories_file, "buffer": paths.buffer}
    data.update({f"model_{v}": experience_model_dir(paths, v) for v in present})
    sections = ("experience", "ablation", "buffer")
    table: dict[str, dict[str, Any]] = {}
    with stage_run("evaluate_fidelity", "experience", cfg, sections, paths.root, data) as run:
        run.set_tags({"split": "validation", "variants": ",".join(present)})
        for variant in present:
            if cfg.experience.model == GROUNDED:
                summary, rows = fidelity_grounded(cfg, paths, trajectories, variant)
                open_loop = None
            else:
                summary, rows, open_loop = _evaluate_variant(cfg, paths, trajectories, variant)
            table[variant] = summary
            run.log_metrics({f"{variant}.{k}": v for k, v in numbers(summary).items()})
            run.log_dict(rows, f"fidelity/{variant}/table.json")
            run.log_dict(worst_rows(rows), f"fidelity/{variant}/worst_examples.json")
            if open_loop is not None:
                run.log_dict(open_loop, "fidelity/full/open_loop.json")
                for d in open_loop["per_depth"]:
                    run.log_metrics(
                        {
                            "open_loop.state_soft_match": d["state_soft_match"],
                            "open_loop.reward_accuracy": d["reward_accuracy"],
                        },
                        step=d["depth"],
                    )
        full = table["full"]
        # held-out metrics in the promotion rule's tag format (reward accuracy with its CI)
        held_out = {
            **metric_tags(
                "reward_accuracy",
                HeldOutMetric(  # min/max: float rounding must not put the value outside
                    full["reward_accuracy"],
                    min(full["reward_accuracy"], 1 - full["eps_R_ci95_high"]),
                    max(full["reward_accuracy"], 1 - full["eps_R_ci95_low"]),
                    full["n"],
                ),
            ),
            **metric_tags("fidelity_score", HeldOutMetric(full["fidelity_score"], n=full["n"])),
        }
        # the quality floors: each metric beside its trivial baseline on the same data
        for metric, baseline in EXPERIENCE_FLOORS:
            if metric in full and baseline in full:
                if metric != "reward_accuracy":
                    held_out.update(metric_tags(metric, HeldOutMetric(full[metric], n=full["n"])))
                held_out.update(baseline_tags(metric, full[baseline]))
        version = None
        if ablation_of(cfg.ablation.model_dump()) is None:
            # an ablation run's model is not experience-model@candidate: tag nothing
            version = tag_model_alias(
                REGISTERED_MODEL,
                CANDIDATE_ALIAS,
                held_out | alias_tags("fidelity", full, FIDELITY_TAGS, "n", run.run_id),
            )
    fidelity = {v: numbers(m) for v, m in table.items()}
    # which env's validation transitions: metrics/ holds the last env run in the workspace
    fidelity["_provenance"] = run_provenance(paths.root, cfg.profile, cfg.env.name)
    write_json(paths.metrics / FIDELITY_METRICS, fidelity)
    # the one-screen part that `dvc metrics show` / `dvc exp show` print
    headline = paths.metrics / HEADLINE_DIR / FIDELITY_HEADLINE
    headline.parent.mkdir(parents=True, exist_ok=True)
    write_json(headline, fidelity_headline(table.get("full")))
    for variant, m in table.items():
        log.info(
            "fidelity %-12s n=%d reward acc %.3f, state EM %.3f / soft %.3f, malformed %.3f",
            variant,
            m["n"],
            m["reward_accuracy"],
            m["state_exact_match"],
            m["state_soft_match"],
            m["malformed_rate"],
        )
    return {"variants": table, "registered_version": version}


def _evaluate_variant(
    cfg: Config, paths: Paths, trajectories: list[Trajectory], variant: str
) -> tuple[dict[str, Any], list[dict[str, Any]], dict[str, Any] | None]:
    """Single-step fidelity of one variant (+ open-loop rollouts for ``full``)."""
    from components.evaluation.fidelity import evaluate_fidelity as score
    from components.evaluation.open_loop import open_loop_rollouts
    from components.experience.dataset import build_examples, select_transitions
    from components.experience.sft import load_meta
    from components.lm.generate import Generator
    from components.lm.models import load_pretrained_dir

    ecfg = cfg.experience
    mdir = experience_model_dir(paths, variant)
    meta = load_meta(mdir)
    settings = PromptSettings(**meta["prompt"])  # exactly what the model was trained on
    retriever = open_retriever(cfg, paths, settings.k)
    # the same seeded validation sample for every variant
    pairs = select_transitions(trajectories, "validation", ecfg.eval_examples, ecfg.seed)
    # only next state and reward are scored: no teacher traces needed (nor read)
    examples, stats = build_examples(pairs, settings, None, retriever, require_reasoning=False)
    model, tokenizer = load_pretrained_dir(mdir)
    generator = Generator(model, tokenizer)

    def generate(prompts: list[list[dict[str, str]]]) -> list[str]:
        return generator.generate(
            prompts,
            max_new_tokens=ecfg.max_new_tokens,
            temperature=ecfg.temperature,
            batch_size=ecfg.gen_batch_size,
            seed=ecfg.seed,
        )

    log.info("fidelity: %s on %d validation transitions", variant, len(examples))
    summary, rows = score(generate, examples, with_reasoning=settings.with_reasoning)
    summary["leaks_dropped"] = stats["leaks_dropped"]
    open_loop = None
    if variant == "full" and ecfg.open_loop_episodes > 0:
        import random

        episodes = [t for t in trajectories if t.split == "validation"]
        random.Random(ecfg.seed).shuffle(episodes)
        open_loop = open_loop_rollouts(
            generate,
            episodes[: ecfg.open_loop_episodes],
            settings,
            retriever,
            ecfg.open_loop_horizon,
        )
        last = open_loop["per_depth"][-1] if open_loop["per_depth"] else None
        if last is not None:
            summary["open_loop_depth"] = last["depth"]
            summary["open_loop_state_soft_match"] = last["state_soft_match"]
            summary["open_loop_reward_accuracy"] = last["reward_accuracy"]
    return summary, rows, open_loop


def fidelity_grounded(
    cfg: Config, paths: Paths, trajectories: list[Trajectory], variant: str
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Single-step fidelity of a grounded variant on every validation transition."""
    from components.evaluation import fidelity as fid
    from components.experience.format import render_answer
    from components.experience.grounded import GroundedModel, episode_rows
    from components.stages.data import load_tasks

    model = GroundedModel.load(experience_model_dir(paths, variant))
    tasks = {t.task_id: t for t in load_tasks(paths)}
    held_out = [t for t in trajectories if t.split == "validation" and t.source == "real"]
    real_next = fid.next_admissible(held_out)
    rows = []
    commands = []
    evidence: dict[str, int] = {}
    fallbacks = 0
    start = time.perf_counter()
    for memory, step, _ in episode_rows(held_out):
        o = model.predict(
            tasks[step.task_id], memory, step.state, step.action, step.admissible_actions or ()
        )
        answer = render_answer(o.next_state, o.reward, o.reasoning)
        row = fid.score_row(step, answer, o.next_state, o.reward)
        row["win_score"] = o.win_score
        rows.append(row)
        evidence[o.evidence] = evidence.get(o.evidence, 0) + 1
        fallbacks += o.admissible_fallback
        true = real_next.get((step.episode_id, step.step_index))
        if true is not None:
            commands.append((o.admissible, true, step.admissible_actions or ()))
    if not rows:
        raise ValueError("no validation transition to measure fidelity on")
    summary = fid.summarize(rows) | fid.admissible_summary(commands)
    summary["admissible_fallback_share"] = fallbacks / len(rows)
    summary["seconds"] = round(time.perf_counter() - start, 2)
    summary["transitions_per_second"] = round(len(rows) / max(summary["seconds"], 1e-9), 1)
    summary.update({f"evidence_{k}": v / len(rows) for k, v in evidence.items()})
    return summary, rows
