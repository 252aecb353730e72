"""The OpenAI judge: GPT-4o (or an OpenAI-compatible server) scores whole trajectories."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from components.config import JudgeConfig, TeacherConfig
from components.config.base import fields_of
from components.evaluation.judge_criteria import (
    CRITERIA,
    OPENAI,
    SCORES,
    JudgeError,
    JudgeOutput,
    aggregate,
)
from components.schema import Trajectory
from components.teacher.base import MalformedAnswerError

SYSTEM_PROMPT = (
    "You evaluate trajectories produced by a learned simulator (a world model) of a "
    "text-based environment. For the whole trajectory, score four criteria on 0, 1 or 2:\n"
    "- consistency: each next state and reward follow plausibly from the previous state and "
    "the action (objects persist, invalid actions change nothing, reward 1 only when the "
    "task is completed). 2 = fully consistent, 1 = minor slips, 0 = contradictions.\n"
    "- diversity: the trajectory visits varied states and actions rather than repeating "
    "itself. 2 = varied, 1 = some repetition, 0 = stuck or looping.\n"
    "- informativeness: the states carry the effect of each action (feedback and what "
    "changed) so an agent can learn from them. 2 = always, 1 = sometimes, 0 = rarely.\n"
    "- hallucination: 2 = no object, place or fact appears that the earlier states or the "
    "actions do not support, 1 = minor invented details, 0 = invented objects or places.\n"
    "Answer with ONE JSON object and nothing else: "
    '{"consistency": <0|1|2>, "diversity": <0|1|2>, "informativeness": <0|1|2>, '
    '"hallucination": <0|1|2>, "rationale": "<one short sentence>"}'
)
_VERDICT = re.compile(r"\A\s*(?:```(?:json)?\s*)?(?P<obj>\{.*\})\s*(?:```)?\s*\Z", re.DOTALL)
MAX_RATIONALE_CHARS = 1000


def _clip(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 3] + "..."


def render_trajectory(traj: Trajectory, cfg: JudgeConfig) -> str:
    """The user message showing one trajectory to the judge (clipped to the config)."""
    first = traj.steps[0]
    parts = [
        f"Task: {first.instruction}",
        f"Initial state:\n{_clip(traj.initial_state, cfg.max_state_chars)}",
    ]
    shown = traj.steps[: cfg.max_steps_shown]
    for s in shown:
        parts.append(
            f"Step {s.step_index}\nAction: {s.action}\n"
            f"Next state:\n{_clip(s.next_state, cfg.max_state_chars)}\n"
            f"Reward: {s.reward}   Done: {'yes' if s.done else 'no'}"
        )
    if len(traj.steps) > len(shown):
        parts.append(f"({len(traj.steps) - len(shown)} further steps not shown)")
    parts.append("Score the trajectory. Answer with the JSON object only.")
    return "\n\n".join(parts)


def parse_verdict(text: str) -> dict[str, Any]:
    """The four 0/1/2 scores (+ rationale) from a judge answer; raises MalformedAnswerError."""
    m = _VERDICT.match(text or "")
    if m is None:
        raise MalformedAnswerError("verdict is not a single JSON object")
    try:
        data = json.loads(m.group("obj"))
    except ValueError:
        raise MalformedAnswerError("verdict is not valid JSON") from None
    if not isinstance(data, dict):
        raise MalformedAnswerError("verdict is not a JSON object")
    missing = [c for c in CRITERIA if c not in data]
    if missing:
        raise MalformedAnswerError(f"verdict misses {missing}")
    extra = sorted(set(data) - set(CRITERIA) - {"rationale"})
    if extra:
        raise MalformedAnswerError(f"verdict has unknown keys {extra}")
    out: dict[str, Any] = {}
    for c in CRITERIA:
        v = data[c]
        # bool is an int in Python and 2.0 is not a rubric score: both are malformed
        if isinstance(v, bool) or not isinstance(v, int) or v not in SCORES:
            raise MalformedAnswerError(f"{c} must be 0, 1 or 2, got {v!r}")
        out[c] = v
    rationale = data.get("rationale", "")
    if not isinstance(rationale, str):
        raise MalformedAnswerError("rationale must be a string")
    out["rationale"] = rationale[:MAX_RATIONALE_CHARS]
    return out


@dataclass(frozen=True)
class JudgeRequest:
    """One trajectory to judge: its id and chat messages."""

    id: str
    messages: tuple[dict[str, str], ...]


# the judge's settings the teacher's client reads under the same names
TEACHER_FIELDS = [
    "model",
    "base_url",
    "api_key_env",
    "concurrency",
    "max_retries",
    "timeout_s",
    "max_cost_usd",
    "max_tokens",
    "temperature",
    "backoff_base_s",
    "backoff_max_s",
    "price_input_per_mtok",
    "price_output_per_mtok",
]


def teacher_config(cfg: JudgeConfig) -> TeacherConfig:
    """The judge's client settings in the teacher's config type (its retry loop is reused)."""
    return TeacherConfig(backend="openai", **fields_of(cfg, *TEACHER_FIELDS))


def _openai_client_class() -> type:
    from components.teacher.openai_teacher import OpenAITeacher

    class _VerdictClient(OpenAITeacher):
        """The teacher's client and retry loop with the judge's messages and parser."""

        def _messages(self, req: Any) -> list[dict[str, str]]:
            return [dict(m) for m in req.messages]

        def _parse(self, content: str) -> str:
            return json.dumps(parse_verdict(content), sort_keys=True)

    return _VerdictClient


class OpenAIJudge:
    """GPT-4o (or any OpenAI-compatible server) scoring whole trajectories."""

    backend = OPENAI

    def __init__(self, cfg: JudgeConfig) -> None:
        from components.teacher.openai_teacher import resolve_price

        if not os.environ.get(cfg.api_key_env) and cfg.base_url is None:
            raise JudgeError(
                f"judge.backend=openai needs an API key in the environment variable "
                f"{cfg.api_key_env} (or judge.base_url for a local server)"
            )
        tcfg = teacher_config(cfg)
        if cfg.max_cost_usd is not None and resolve_price(tcfg) is None:
            raise JudgeError(
                f"judge.max_cost_usd is set but no price is known for {cfg.model!r}: set "
                "judge.price_input_per_mtok / price_output_per_mtok, or max_cost_usd: null"
            )
        self.cfg = cfg
        self._client = _openai_client_class()(tcfg)

    def close(self) -> None:
        """Close the HTTP client."""
        self._client.close()

    def judge(self, trajectories: Sequence[Trajectory]) -> JudgeOutput:
        """One request per trajectory (concurrent); failures become rows with their reason."""
        requests = [
            JudgeRequest(
                id=t.episode_id,
                messages=(
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": render_trajectory(t, self.cfg)},
                ),
            )
            for t in trajectories
        ]
        answers = self._client.annotate(requests)  # type: ignore[arg-type]
        rows = []
        for traj, ann in zip(trajectories, answers, strict=True):
            row: dict[str, Any] = {
                "episode_id": traj.episode_id,
                "task_id": traj.task_id,
                "n_steps": traj.n_steps,
                "status": ann.status,
                "attempts": ann.attempts,
                "error": ann.error,
                "malformed": bool(ann.error and ann.error.startswith("malformed answer")),
                "cost_usd": ann.cost_usd,
            }
            verdict = json.loads(ann.reasoning) if ann.ok and ann.reasoning else None
            for c in CRITERIA:
                row[c] = verdict[c] if verdict else None
            row["rationale"] = verdict["rationale"] if verdict else None
            if not ann.ok:
                row["raw"] = ann.raw
            rows.append(row)
        summary = aggregate(rows)
        summary.update(
            {
                "n_malformed": sum(r["malformed"] for r in rows),
                "n_retried": sum(r["attempts"] > 1 for r in rows),
                "attempts": sum(r["attempts"] for r in rows),
                "prompt_tokens": sum(a.prompt_tokens for a in answers),
                "completion_tokens": sum(a.completion_tokens for a in answers),
                "cost_usd": self._client.spent_usd,
                "budget_exhausted": self._client.budget_exhausted,
                "model": self.cfg.model,
            }
        )
        return JudgeOutput(summary, rows)
