"""Judge of synthetic experience: the paper's four criteria on a 0/1/2 rubric.

DreamGym asks GPT-4o to score sampled synthetic trajectories for **consistency**,
**diversity**, **informativeness** and **hallucination** (0 = bad, 1 = partly, 2 = good;
for hallucination 2 = none). Two backends score the same seeded sample:

``openai``  GPT-4o or any OpenAI-compatible server. One request per trajectory; the answer
            must be one JSON object ``{"consistency": 0-2, "diversity": 0-2,
            "informativeness": 0-2, "hallucination": 0-2, "rationale": "..."}`` (strict
            parser; a malformed verdict is re-sampled, then counted as failed). The HTTP
            client, retries, cost budget and key redaction are the teacher's
            (components/teacher/openai_teacher.py).
``grounded`` offline and exact where an LLM would guess: every synthetic transition is
            replayed in the REAL simulator (``ReplayableEnv.replay``: reset, the
            trajectory's previous actions, its action) and the prediction is compared with
            what really happened:

            - consistency: next-state token F1 with the real next state (>= f1_high: 2,
              >= f1_low: 1) and the reward right; a wrong reward scores 0. A step the
              synthetic world took after the real episode had already ended scores 0.
            - hallucination: entities the predicted state mentions (article + noun
              phrases, location, inventory) whose head noun exists neither in the real
              state before nor after the step: none = 2, a share <= tolerance = 1, else 0.
            - informativeness: the predicted state carries the action's real effect: the
              real feedback's content words (in its feedback line) and the world's
              sentences that really changed (added ones present, removed ones gone),
              each recalled >= threshold. Both = 2, one = 1, none = 0; a copy of the
              previous state scores 0.
            - diversity (set level): per task in the sample, the share of distinct next
              states and of distinct actions among its transitions, averaged
              (>= diversity_high: 2, >= diversity_low: 1); each trajectory gets its task's.

A trajectory's score per criterion is its transitions' mean rounded to 0/1/2 (half up).
Summaries give per criterion the mean over trajectories and the 0/1/2 distribution;
``compare_variants`` turns the summaries of the ablation variants into one table.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from components.config import JudgeConfig
from components.envs.base import ReplayableEnv

# the judge's API lives in the modules below; re-exported so callers import it from here
from components.evaluation.judge_criteria import (
    CRITERIA,
    FULL,
    GROUNDED,
    NO_HISTORY,
    NO_REASONING,
    NO_REPLAY,
    OPENAI,
    SCORES,
    VARIANT_LABELS,
    VARIANTS,
    Judge,
    JudgeError,
    JudgeOutput,
    aggregate,
    compare_variants,
    judge_metrics,
    sample_trajectories,
    to_score,
)
from components.evaluation.judge_grounded import (
    GroundedJudge,
    consistency_score,
    content_words,
    diversity_by_task,
    diversity_ratio,
    diversity_score,
    effect_recalls,
    entities,
    hallucination_score,
    informativeness_score,
    state_fields,
    without_feedback,
    world_units,
)
from components.evaluation.judge_openai import (
    MAX_RATIONALE_CHARS,
    SYSTEM_PROMPT,
    JudgeRequest,
    OpenAIJudge,
    parse_verdict,
    render_trajectory,
    teacher_config,
)
from components.schema import Task, Trajectory

__all__ = [
    "CRITERIA",
    "FULL",
    "GROUNDED",
    "MAX_RATIONALE_CHARS",
    "NO_HISTORY",
    "NO_REASONING",
    "NO_REPLAY",
    "OPENAI",
    "SCORES",
    "SYSTEM_PROMPT",
    "VARIANTS",
    "VARIANT_LABELS",
    "GroundedJudge",
    "Judge",
    "JudgeError",
    "JudgeOutput",
    "JudgeRequest",
    "OpenAIJudge",
    "aggregate",
    "compare_variants",
    "consistency_score",
    "content_words",
    "diversity_by_task",
    "diversity_ratio",
    "diversity_score",
    "effect_recalls",
    "entities",
    "hallucination_score",
    "informativeness_score",
    "judge_metrics",
    "make_judge",
    "parse_verdict",
    "render_trajectory",
    "run_judge",
    "sample_trajectories",
    "state_fields",
    "teacher_config",
    "to_score",
    "without_feedback",
    "world_units",
]


def run_judge(judge: Judge, trajectories: Sequence[Trajectory], n: int, seed: int) -> JudgeOutput:
    """Judge a seeded sample of ``n`` synthetic trajectories."""
    sample = sample_trajectories(trajectories, n, seed)
    out = judge.judge(sample)
    out.summary.update(
        {"backend": judge.backend, "n_available": len(trajectories), "n_sampled": len(sample)}
    )
    return out


def make_judge(
    cfg: JudgeConfig,
    env: ReplayableEnv | None = None,
    tasks: Mapping[str, Task] | None = None,
) -> Judge:
    """The judge named by ``judge.backend`` (grounded needs the real env and the tasks)."""
    if cfg.backend == OPENAI:
        return OpenAIJudge(cfg)
    if env is None or tasks is None:
        raise JudgeError("the grounded judge needs a replayable real env and the task table")
    if not hasattr(env, "replay"):
        raise JudgeError(f"env {getattr(env, 'name', env)!r} cannot replay transitions")
    return GroundedJudge(env, tasks, cfg)
