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

import json
import math
import os
import random
import re
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from components.config import JudgeConfig, TeacherConfig
from components.envs.base import FEEDBACK, EnvError, ReplayableEnv
from components.evaluation.fidelity import normalize_state, token_f1
from components.schema import Task, Trajectory
from components.teacher.base import MalformedAnswerError

CRITERIA = ("consistency", "diversity", "informativeness", "hallucination")
SCORES = (0, 1, 2)
# the ablation variants compared (same names as the ablation switches / fidelity variants)
FULL, NO_HISTORY, NO_REASONING, NO_REPLAY = "full", "no_history", "no_reasoning", "no_replay"
VARIANTS = (FULL, NO_HISTORY, NO_REASONING, NO_REPLAY)
VARIANT_LABELS = {
    FULL: "DreamGym (full)",
    NO_HISTORY: "w/o history",
    NO_REASONING: "w/o reasoning",
    NO_REPLAY: "w/o replay",
}
GROUNDED, OPENAI = "grounded", "openai"

_STOP_WORDS = (
    "a an the some of to in on at into onto from with and or but is are was were be been "
    "it its this that these those there here you your i me my we our they them he she his "
    "her as by for not no can can't cannot do does did have has had so then than just "
    "also very too any all what which who where when how"
)
_STOP = frozenset(_STOP_WORDS.split())
# words that end an entity phrase started by an article (verbs of scene descriptions)
_END_WORDS = (
    "contains contain carrying holding lying sitting standing hanging resting stands stand "
    "sits sit lies lie hangs hang rests rest seems seem looks look appears appear reads read "
    "says say leans lean waits wait"
)
_PHRASE_END = _STOP | frozenset(_END_WORDS.split())
_WORD = re.compile(r"[a-z][a-z'-]*")
_SEGMENTS = re.compile(r"[.,;:!?()\[\]\n]")
_ARTICLES = frozenset({"a", "an", "the", "some"})
_FIELD = re.compile(r"^(?P<key>[A-Za-z][A-Za-z ]{0,24}):\s*(?P<value>.*)$")
_MAX_PHRASE_WORDS = 4
_UNITS = re.compile(r"[.\n]")


class JudgeError(RuntimeError):
    """The judge cannot run (missing key, unknown price with a budget, bad input)."""


# -- state text helpers --------------------------------------------------------------------


def state_fields(text: str) -> dict[str, str]:
    """``Key: value`` lines of an abstract state by lower-case key; other lines as 'body'."""
    fields: dict[str, str] = {}
    body: list[str] = []
    for line in text.splitlines():
        m = _FIELD.match(line.strip())
        if m and m.group("key").lower() in {"location", "inventory", "feedback", "exits"}:
            fields[m.group("key").lower()] = m.group("value").strip()
        else:
            body.append(line)
    fields["body"] = " ".join(body).strip()
    return fields


def without_feedback(text: str) -> str:
    """The state without its ``Feedback:`` line (the world, not the env's answer)."""
    return "\n".join(ln for ln in text.splitlines() if not ln.lower().startswith("feedback:"))


def content_words(text: str) -> set[str]:
    """Lower-case words of ``text`` without stop words (what carries information)."""
    return {w for w in _WORD.findall(text.lower()) if w not in _STOP}


def entities(text: str) -> set[str]:
    """Head nouns of the things a state mentions: article phrases, location, inventory."""
    heads: set[str] = set()
    fields = state_fields(text)
    location = fields.get("location", "")
    if location:
        words = _WORD.findall(location.lower())
        if words:
            heads.add(words[-1])
    for segment in _SEGMENTS.split(text.lower()):
        words = _WORD.findall(segment)
        i = 0
        while i < len(words):
            if words[i] not in _ARTICLES:
                i += 1
                continue
            phrase: list[str] = []
            j = i + 1
            while j < len(words) and len(phrase) < _MAX_PHRASE_WORDS:
                if words[j] in _PHRASE_END:
                    break
                phrase.append(words[j])
                j += 1
            if phrase:
                heads.add(phrase[-1])
            i = max(j, i + 1)
    return heads


def to_score(value: float) -> int:
    """A mean score in [0, 2] rounded half up to the rubric's 0/1/2."""
    return int(min(2, max(0, math.floor(value + 0.5))))


# -- grounded per-transition scores --------------------------------------------------------


def consistency_score(f1: float, reward_match: bool, cfg: JudgeConfig) -> int:
    """2/1/0 from the next-state F1 thresholds; a wrong reward is 0."""
    if not reward_match:
        return 0
    if f1 >= cfg.consistency_f1_high:
        return 2
    return 1 if f1 >= cfg.consistency_f1_low else 0


def hallucination_score(n_unknown: int, n_mentioned: int, cfg: JudgeConfig) -> int:
    """2 = no unknown entity, 1 = a share <= tolerance, 0 = more."""
    if n_unknown == 0:
        return 2
    share = n_unknown / max(1, n_mentioned)
    return 1 if share <= cfg.hallucination_tolerance else 0


def world_units(text: str) -> set[str]:
    """Normalised sentences / lines of a state's world (its feedback line excluded)."""
    parts = _UNITS.split(without_feedback(text))
    return {u for u in (normalize_state(p) for p in parts) if u}


def effect_recalls(
    predicted: str, real_prev: str, real_next: str, real_feedback: str
) -> tuple[float, float]:
    """(feedback recall, change recall) of the real effect of an action in a prediction.

    Feedback: share of the real feedback's content words in the predicted feedback line
    (the whole prediction when it has none). Change: over the world's sentences that
    really changed, the added ones the prediction has and the removed ones it no longer
    has (normalised exact match: an inventory line one item short did not carry the
    change). Sentences, not words: moving the broom from the board to the inventory
    changes no word set, but it changes two sentences.
    """
    fb_line = state_fields(predicted).get("feedback")
    pred_words = content_words(fb_line if fb_line is not None else predicted)
    feedback = content_words(real_feedback)
    feedback_recall = len(feedback & pred_words) / len(feedback) if feedback else 1.0
    before, after = world_units(real_prev), world_units(real_next)
    pred = world_units(predicted)
    added, removed = after - before, before - after
    if not added and not removed:
        # nothing changed in the world: carried iff the predicted world is the real one
        change_recall = len(pred & after) / len(pred) if pred else 0.0
    else:
        hits = len(added & pred) + len(removed - pred)
        change_recall = hits / (len(added) + len(removed))
    return feedback_recall, change_recall


def informativeness_score(feedback_recall: float, change_recall: float, cfg: JudgeConfig) -> int:
    """One point each for carrying the real feedback and the real change."""
    thr = cfg.informativeness_recall
    return int(feedback_recall >= thr) + int(change_recall >= thr)


def diversity_ratio(trajectories: Sequence[Trajectory]) -> float:
    """Mean of the shares of distinct next states and distinct actions among transitions."""
    steps = [s for t in trajectories for s in t.steps]
    if not steps:
        return 0.0
    states = {normalize_state(s.next_state) for s in steps}
    actions = {normalize_state(s.action) for s in steps}
    return 0.5 * (len(states) + len(actions)) / len(steps)


def diversity_score(ratio: float, cfg: JudgeConfig) -> int:
    """2/1/0 from the distinct-share thresholds."""
    if ratio >= cfg.diversity_high:
        return 2
    return 1 if ratio >= cfg.diversity_low else 0


def diversity_by_task(
    trajectories: Sequence[Trajectory], cfg: JudgeConfig
) -> dict[str, tuple[float, int]]:
    """task_id -> (distinct ratio, 0/1/2 score) over the sampled trajectories of each task."""
    by_task: dict[str, list[Trajectory]] = defaultdict(list)
    for t in trajectories:
        by_task[t.task_id].append(t)
    out = {}
    for task_id, group in by_task.items():
        ratio = diversity_ratio(group)
        out[task_id] = (ratio, diversity_score(ratio, cfg))
    return out


# -- results ---------------------------------------------------------------------------------


@dataclass
class JudgeOutput:
    """A judged sample: the summary, one row per trajectory, one per replayed transition."""

    summary: dict[str, Any]
    rows: list[dict[str, Any]]
    transitions: list[dict[str, Any]] = field(default_factory=list)


class Judge(Protocol):
    """Scores trajectories on the four criteria (failures are rows, never exceptions)."""

    backend: str

    def judge(self, trajectories: Sequence[Trajectory]) -> JudgeOutput:
        """Score every trajectory; rows in input order."""
        ...


def sample_trajectories(trajectories: Sequence[Trajectory], n: int, seed: int) -> list[Trajectory]:
    """A seeded sample of at most ``n`` synthetic trajectories (same input, same sample)."""
    pool = sorted(
        (t for t in trajectories if t.source == "synthetic" and t.steps),
        key=lambda t: t.episode_id,
    )
    if len(pool) <= n:
        return pool
    return random.Random(seed).sample(pool, n)


def aggregate(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per criterion: mean over judged trajectories, 0/1/2 distribution and count."""
    judged = [r for r in rows if r.get("status", "ok") == "ok"]
    out: dict[str, Any] = {
        "n": len(judged),
        "n_rows": len(rows),
        "n_failed": sum(r.get("status") == "failed" for r in rows),
        "n_skipped": sum(r.get("status") == "skipped" for r in rows),
    }
    for c in CRITERIA:
        values = [int(r[c]) for r in judged if r.get(c) is not None]
        counts = Counter(values)
        out[c] = {
            "mean": sum(values) / len(values) if values else None,
            "n": len(values),
            "distribution": {str(s): counts.get(s, 0) for s in SCORES},
        }
    return out


def judge_metrics(summary: Mapping[str, Any]) -> dict[str, Any]:
    """The metrics-file entry of one variant: each criterion's mean and ``n``."""
    out: dict[str, Any] = {c: summary[c]["mean"] for c in CRITERIA}
    out["n"] = summary["n"]
    return out


def compare_variants(summaries: Mapping[str, Mapping[str, Any]]) -> tuple[dict[str, Any], str]:
    """One table of the variants' judge scores: (``{variant: metrics}``, markdown)."""
    order = [v for v in VARIANTS if v in summaries] + sorted(set(summaries) - set(VARIANTS))
    table = {v: judge_metrics(summaries[v]) for v in order}
    head = "| variant | n | " + " | ".join(CRITERIA) + " |"
    lines = [head, "|" + "---|" * (len(CRITERIA) + 2)]
    for v in order:
        m = table[v]
        cells = ["n/a" if m[c] is None else f"{m[c]:.2f}" for c in CRITERIA]
        lines.append(f"| {VARIANT_LABELS.get(v, v)} | {m['n']} | " + " | ".join(cells) + " |")
    note = "Scores 0-2 (higher is better; hallucination 2 = none), mean over trajectories."
    return table, "\n".join(lines) + "\n\n" + note + "\n"


def run_judge(judge: Judge, trajectories: Sequence[Trajectory], n: int, seed: int) -> JudgeOutput:
    """Judge a seeded sample of ``n`` synthetic trajectories."""
    sample = sample_trajectories(trajectories, n, seed)
    out = judge.judge(sample)
    out.summary.update(
        {"backend": judge.backend, "n_available": len(trajectories), "n_sampled": len(sample)}
    )
    return out


# -- grounded judge ----------------------------------------------------------------------------


class GroundedJudge:
    """Scores synthetic transitions against the real simulator by replay (offline)."""

    backend = GROUNDED

    def __init__(self, env: ReplayableEnv, tasks: Mapping[str, Task], cfg: JudgeConfig) -> None:
        self.env = env
        self.tasks = dict(tasks)
        self.cfg = cfg

    def judge(self, trajectories: Sequence[Trajectory]) -> JudgeOutput:
        """Replay every transition of every trajectory; per-trajectory and per-step rows."""
        from tqdm.auto import tqdm

        diversity = diversity_by_task(trajectories, self.cfg)
        rows: list[dict[str, Any]] = []
        transitions: list[dict[str, Any]] = []
        # replay re-runs each step's prefix in the real env: minutes for 100 trajectories
        bar = tqdm(trajectories, desc="judge (grounded replay)", unit="traj", mininterval=2.0)
        for traj in bar:
            steps, reason = self._replay_trajectory(traj)
            transitions.extend(steps)
            rows.append(self._trajectory_row(traj, steps, reason, diversity[traj.task_id]))
        summary = aggregate(rows)
        summary.update(_transition_stats(transitions))
        return JudgeOutput(summary, rows, transitions)

    def _replay_trajectory(self, traj: Trajectory) -> tuple[list[dict[str, Any]], str | None]:
        task = self.tasks.get(traj.task_id)
        if task is None:
            return [], "unknown task"
        if task.generated:  # every env replays its own real tasks; a generated one has none
            return [], "generated task: no real game to replay"
        try:
            real_prev, _ = self.env.reset(task)
        except EnvError as err:
            return [], f"env error at reset: {err}"
        out: list[dict[str, Any]] = []
        actions: list[str] = []
        ended = False
        for step in traj.steps:
            base = {
                "episode_id": traj.episode_id,
                "task_id": traj.task_id,
                "step_index": step.step_index,
                "action": step.action,
                "reward_pred": step.reward,
            }
            if not ended:
                try:
                    result = self.env.replay(task, actions, step.action)
                except ValueError:  # the real episode ended inside the prefix
                    ended = True
                except EnvError as err:
                    out.append({**base, "replayed": False, "error": f"env error: {err}"})
                    return out, "env error"
            if ended:
                # the synthetic world went on after the real one had ended
                out.append({**base, "replayed": False, "after_real_end": True, "consistency": 0})
                actions.append(step.action)
                continue
            out.append(
                {**base, **self._score_step(step.next_state, step.reward, real_prev, result)}
            )
            real_prev = result.observation
            actions.append(step.action)
            if result.terminated:
                ended = True
        return out, None

    def _score_step(
        self, predicted: str, reward_pred: int, real_prev: str, result: Any
    ) -> dict[str, Any]:
        real_next = result.observation
        f1 = token_f1(predicted, real_next)
        reward_match = int(reward_pred) == int(result.reward)
        mentioned = entities(predicted)
        known = content_words(real_prev) | content_words(real_next)
        unknown = sorted(mentioned - known)
        # the abstract state's own feedback line, else the env's raw answer (other envs)
        feedback = state_fields(real_next).get("feedback") or str(result.info.get(FEEDBACK) or "")
        fb_recall, change_recall = effect_recalls(predicted, real_prev, real_next, feedback)
        return {
            "replayed": True,
            "after_real_end": False,
            "reward_real": int(result.reward),
            "reward_match": reward_match,
            "state_f1": f1,
            "state_em": normalize_state(predicted) == normalize_state(real_next),
            "n_entities": len(mentioned),
            "unknown_entities": unknown,
            "feedback_recall": fb_recall,
            "change_recall": change_recall,
            "consistency": consistency_score(f1, reward_match, self.cfg),
            "hallucination": hallucination_score(len(unknown), len(mentioned), self.cfg),
            "informativeness": informativeness_score(fb_recall, change_recall, self.cfg),
        }

    def _trajectory_row(
        self,
        traj: Trajectory,
        steps: list[dict[str, Any]],
        reason: str | None,
        diversity: tuple[float, int],
    ) -> dict[str, Any]:
        row: dict[str, Any] = {
            "episode_id": traj.episode_id,
            "task_id": traj.task_id,
            "n_steps": traj.n_steps,
            "n_replayed": sum(bool(s.get("replayed")) for s in steps),
            "n_after_real_end": sum(bool(s.get("after_real_end")) for s in steps),
            "diversity_ratio": diversity[0],
        }
        scored = [s for s in steps if s.get("consistency") is not None]
        if reason is not None and not scored:
            return {**row, "status": "skipped", "error": reason, **dict.fromkeys(CRITERIA)}
        row["status"] = "ok"
        row["error"] = reason
        for c in ("consistency", "hallucination", "informativeness"):
            values = [s[c] for s in steps if s.get(c) is not None]
            row[f"{c}_mean"] = sum(values) / len(values) if values else None
            row[c] = to_score(row[f"{c}_mean"]) if values else None
        row["diversity"] = diversity[1]
        return row


def _transition_stats(rows: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Step-level figures of a grounded run (also the model errors eps_R / eps_P)."""
    replayed = [r for r in rows if r.get("replayed")]
    n = len(replayed)
    return {
        "n_transitions": len(rows),
        "n_transitions_replayed": n,
        "n_transitions_after_real_end": sum(bool(r.get("after_real_end")) for r in rows),
        "transition_reward_match": sum(r["reward_match"] for r in replayed) / n if n else None,
        "transition_state_f1": sum(r["state_f1"] for r in replayed) / n if n else None,
        "transition_state_em": sum(r["state_em"] for r in replayed) / n if n else None,
    }


# -- openai judge ------------------------------------------------------------------------------

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


def teacher_config(cfg: JudgeConfig) -> TeacherConfig:
    """The judge's client settings in the teacher's config type (its retry loop is reused)."""
    return TeacherConfig(
        backend="openai",
        model=cfg.model,
        base_url=cfg.base_url,
        api_key_env=cfg.api_key_env,
        concurrency=cfg.concurrency,
        max_retries=cfg.max_retries,
        timeout_s=cfg.timeout_s,
        max_cost_usd=cfg.max_cost_usd,
        max_tokens=cfg.max_tokens,
        temperature=cfg.temperature,
        backoff_base_s=cfg.backoff_base_s,
        backoff_max_s=cfg.backoff_max_s,
        price_input_per_mtok=cfg.price_input_per_mtok,
        price_output_per_mtok=cfg.price_output_per_mtok,
    )


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
