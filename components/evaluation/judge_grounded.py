"""The grounded judge: synthetic transitions replayed in the real simulator (offline)."""

from __future__ import annotations

import re
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from components.config import JudgeConfig
from components.envs.base import FEEDBACK, EnvError, ReplayableEnv
from components.evaluation.fidelity import normalize_state, token_f1
from components.evaluation.judge_criteria import (
    CRITERIA,
    GROUNDED,
    JudgeOutput,
    aggregate,
    to_score,
)
from components.schema import Task, Trajectory

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
        from components.progress import progress_bar

        diversity = diversity_by_task(trajectories, self.cfg)
        rows: list[dict[str, Any]] = []
        transitions: list[dict[str, Any]] = []
        # replay re-runs each step's prefix in the real env: minutes for 100 trajectories
        bar = progress_bar(
            trajectories, desc="judge (grounded replay)", unit="traj", mininterval=2.0
        )
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
