"""Fidelity of the experience model against the real simulator's recorded transitions.

For held-out validation transitions the model's answer is parsed strictly and compared
with what the real environment did:

- ``eps_R``: how often the predicted reward differs from the real one (Theorem 1's
  reward error). A malformed answer counts as a reward error: in use it ends the
  episode as a failure, so it is not a faithful transition. Reported with a 95% Wilson
  interval and per true-reward class (rewards are rare: ~5% are 1).
- ``reward_accuracy`` (1 - eps_R) and ``success_f1`` (reward 1 is the positive class;
  a malformed answer counts as predicting failure), beside "always the majority class"
  and "every step wins" (``always_win_baseline_success_f1``).
- ``invalid_action_accuracy``: on transitions whose action the real env rejected, the
  share where the model predicts an unchanged world (location, surroundings, inventory)
  and reward 0 ("nothing changes" scores 1.0 on it by construction).
- next state: exact match after normalisation (``state_exact_match``), token F1
  (``state_soft_match``), and ``eps_P``: the total-variation distance between the
  predicted and the real next-state distributions over a fixed bucketing of states
  (location + inventory; a malformed answer is its own bucket), and ``eps_P_pointwise``,
  the share of transitions whose predicted bucket is wrong (the pooled distance misses a
  model that predicts the right states for the wrong steps). A "copy the current state"
  baseline puts each in context.
- admissible commands of the next state (the grounded model predicts them): exact-set
  match and F1 against the real next step's list, beside "the current state's commands
  stay" (``admissible_summary``).

Nothing is guessed from a malformed answer: it is counted with its reason.
"""

from __future__ import annotations

import math
import re
import time
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

from components.experience.dataset import ExperienceExample
from components.experience.format import MalformedOutputError, parse_answer

GenerateFn = Callable[[list[list[dict[str, str]]]], list[str]]
_PUNCT = re.compile(r"[^\w\s]")
_SPACE = re.compile(r"\s+")


def normalize_state(text: str) -> str:
    """Lower case, punctuation removed, whitespace collapsed."""
    return _SPACE.sub(" ", _PUNCT.sub(" ", text.lower())).strip()


def token_f1(prediction: str, reference: str) -> float:
    """Bag-of-words F1 of the normalised texts (1.0 when both are empty)."""
    pred, ref = normalize_state(prediction).split(), normalize_state(reference).split()
    if not pred and not ref:
        return 1.0
    common = sum((Counter(pred) & Counter(ref)).values())
    if common == 0:
        return 0.0
    precision, recall = common / len(pred), common / len(ref)
    return 2 * precision * recall / (precision + recall)


def wilson_interval(errors: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval of a proportion (good at rates near 0)."""
    if n == 0:
        return 0.0, 1.0
    p = errors / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return max(0.0, centre - half), min(1.0, centre + half)


def world_part(state: str) -> str:
    """The state without its feedback line (what an action changes or leaves unchanged)."""
    lines = [ln for ln in state.splitlines() if not ln.lower().startswith("feedback:")]
    return normalize_state("\n".join(lines))


def state_bucket(state: str) -> str:
    """The coarse bucket of a state for eps_P: its location and inventory lines."""
    keep = [
        normalize_state(ln)
        for ln in state.splitlines()
        if ln.lower().startswith(("location:", "inventory:"))
    ]
    return " | ".join(keep) or normalize_state(state)[:80]


MALFORMED_BUCKET = "<malformed>"


def total_variation(predicted: Sequence[str], real: Sequence[str]) -> float:
    """Total-variation distance between two empirical distributions over buckets."""
    p, q = Counter(predicted), Counter(real)
    n_p, n_q = max(len(predicted), 1), max(len(real), 1)
    # sorted: a set's order varies with the hash seed, and so would the float sum's last digit
    return 0.5 * sum(abs(p[b] / n_p - q[b] / n_q) for b in sorted(set(p) | set(q)))


def score_prediction(example: ExperienceExample, output: str, with_reasoning: bool) -> dict:
    """One row of the fidelity table: the parse outcome and the errors of one answer."""
    try:
        pred = parse_answer(
            output,
            with_reasoning=with_reasoning,
            state=example.state,
            state_target=example.state_target,
        )
    except MalformedOutputError as err:
        return score_row(example, output, None, None, error=str(err))
    return score_row(example, output, pred.next_state, pred.reward)


def score_row(
    true: Any,
    output: str,
    next_state: str | None,
    reward: int | None,
    *,
    error: str | None = None,
) -> dict[str, Any]:
    """A fidelity row from a real transition (``true``: id, episode_id, task_id, step_index,
    state, action, next_state, reward, valid_action) and a prediction (None: malformed)."""
    row: dict[str, Any] = {
        "id": true.id,
        "episode_id": true.episode_id,
        "task_id": true.task_id,
        "step_index": true.step_index,
        "action": true.action,
        "reward_true": true.reward,
        "next_state_true": true.next_state,
        "output": output,
        "copy_state_em": normalize_state(true.state) == normalize_state(true.next_state),
        "copy_state_f1": token_f1(true.state, true.next_state),
        "valid_true": true.valid_action,
        "bucket_true": state_bucket(true.next_state),
        "bucket_copy": state_bucket(true.state),  # the "nothing changes" prediction
    }
    if next_state is None or reward is None:
        return {
            **row,
            "malformed": True,
            "error": error or "malformed",
            "reward_pred": None,
            "reward_error": True,
            "state_em": False,
            "state_f1": 0.0,
            "pred_unchanged": False,
            "bucket_pred": MALFORMED_BUCKET,
        }
    return {
        **row,
        "malformed": False,
        "error": None,
        "reward_pred": reward,
        "reward_error": reward != true.reward,
        "state_em": normalize_state(next_state) == normalize_state(true.next_state),
        "state_f1": token_f1(next_state, true.next_state),
        "pred_unchanged": world_part(next_state) == world_part(true.state),
        "bucket_pred": state_bucket(next_state),
    }


def summarize(rows: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """eps_R (+ Wilson CI, per class), state EM/F1, malformed rate and baselines."""
    n = len(rows)
    if n == 0:
        raise ValueError("no rows to summarise")
    reward_errors = sum(r["reward_error"] for r in rows)
    lo, hi = wilson_interval(reward_errors, n)
    parsed = [r for r in rows if not r["malformed"]]
    out: dict[str, Any] = {
        "n": n,
        "n_malformed": n - len(parsed),
        "malformed_rate": (n - len(parsed)) / n,
        "eps_R": reward_errors / n,
        "eps_R_ci95_low": lo,
        "eps_R_ci95_high": hi,
        "eps_R_parsed": (sum(r["reward_error"] for r in parsed) / len(parsed) if parsed else None),
        "state_exact_match": sum(r["state_em"] for r in rows) / n,
        "state_token_f1": sum(r["state_f1"] for r in rows) / n,
        "eps_P_proxy": 1 - sum(r["state_em"] for r in rows) / n,
        "copy_baseline_state_exact_match": sum(r["copy_state_em"] for r in rows) / n,
        "copy_baseline_state_token_f1": sum(r["copy_state_f1"] for r in rows) / n,
    }
    wins = sum(r["reward_true"] == 1 for r in rows)
    # trivial baseline of reward accuracy: always predict the majority class
    out["majority_baseline_reward_accuracy"] = max(wins, n - wins) / n
    for cls in (0, 1):
        sub = [r for r in rows if r["reward_true"] == cls]
        out[f"n_reward_{cls}"] = len(sub)
        out[f"eps_R_reward_{cls}"] = sum(r["reward_error"] for r in sub) / len(sub) if sub else None
    out.update(_contract_metrics(rows, out))
    # one number to compare models: reward right and state right, malformed = 0 for both
    out["fidelity_score"] = 0.5 * (1 - out["eps_R"]) + 0.5 * out["state_token_f1"]
    out["malformed_reasons"] = dict(
        Counter(_reason(r["error"]) for r in rows if r["malformed"]).most_common()
    )
    return out


def _contract_metrics(rows: Sequence[dict[str, Any]], out: dict[str, Any]) -> dict[str, Any]:
    """The metrics-contract names (reward accuracy, success F1, invalid actions, eps_P)."""
    tp = sum(1 for r in rows if r["reward_true"] == 1 and r["reward_pred"] == 1)
    fp = sum(1 for r in rows if r["reward_true"] == 0 and r["reward_pred"] == 1)
    fn = sum(1 for r in rows if r["reward_true"] == 1 and r["reward_pred"] != 1)
    scores = [r["win_score"] for r in rows if r.get("win_score") is not None]
    invalid = [r for r in rows if not r.get("valid_true", True)]
    invalid_ok = sum(1 for r in invalid if r["pred_unchanged"] and r["reward_pred"] == 0)
    wins = tp + fn
    return {
        "n_transitions": len(rows),
        "reward_accuracy": 1 - out["eps_R"],
        "success_f1": 2 * tp / (2 * tp + fp + fn) if tp + fp + fn else 1.0,
        # trivial baseline of success F1: "every step wins" (tp = wins, fp = the rest);
        # "no step wins" scores 0
        "always_win_baseline_success_f1": 2 * wins / (len(rows) + wins) if rows else 0.0,
        "success_precision": tp / (tp + fp) if tp + fp else 0.0,
        "success_recall": tp / (tp + fn) if tp + fn else 0.0,
        "success_auc": auc(scores, [r["reward_true"] for r in rows])
        if len(scores) == len(rows)
        else None,
        "n_invalid_actions": len(invalid),
        "invalid_action_accuracy": invalid_ok / len(invalid) if invalid else None,
        # "nothing changes" is right on every rejected action by construction
        "copy_baseline_invalid_action_accuracy": 1.0 if invalid else None,
        "state_soft_match": out["state_token_f1"],
        "eps_P": total_variation(
            [r["bucket_pred"] for r in rows], [r["bucket_true"] for r in rows]
        ),
        "eps_P_pointwise": sum(r["bucket_pred"] != r["bucket_true"] for r in rows) / len(rows),
        **_copy_eps_p(rows),
    }


def _copy_eps_p(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """eps_P of "nothing changes" (the current state as the next): the pooled distance is
    small for any model that visits the same states, so both forms need this baseline."""
    if not rows or any("bucket_copy" not in r for r in rows):  # rows saved before it
        return {}
    copy, true = [r["bucket_copy"] for r in rows], [r["bucket_true"] for r in rows]
    return {
        "copy_baseline_eps_P": total_variation(copy, true),
        "copy_baseline_eps_P_pointwise": sum(r["bucket_copy"] != r["bucket_true"] for r in rows)
        / len(rows),
    }


def auc(scores: Sequence[float], labels: Sequence[int]) -> float | None:
    """Area under the ROC curve (probability a win outscores a non-win; ties count half)."""
    pos = [s for s, y in zip(scores, labels, strict=True) if y == 1]
    neg = [s for s, y in zip(scores, labels, strict=True) if y != 1]
    if not pos or not neg:
        return None
    order = sorted(neg)
    import bisect

    wins = sum(
        bisect.bisect_left(order, p)
        + 0.5 * (bisect.bisect_right(order, p) - bisect.bisect_left(order, p))
        for p in pos
    )
    return wins / (len(pos) * len(neg))


def next_admissible(trajectories: Sequence[Any]) -> dict[tuple[str, int], list[str]]:
    """(episode id, step index) -> the real admissible commands of that step's next state."""
    return {
        (a.episode_id, a.step_index): b.admissible_actions
        for t in trajectories
        for a, b in zip(t.steps, t.steps[1:], strict=False)
        if b.admissible_actions
    }


def admissible_summary(
    triples: Sequence[tuple[Sequence[str], Sequence[str], Sequence[str]]],
) -> dict[str, Any]:
    """Next-state admissible commands, predicted vs real, beside "the commands stay".

    ``triples``: (predicted, real next state's, current state's) command lists.
    """
    if not triples:
        return {"n_admissible": 0}

    def f1(pred: Sequence[str], true: Sequence[str]) -> float:
        p, t = set(pred), set(true)
        return 2 * len(p & t) / (len(p) + len(t)) if p or t else 1.0

    n = len(triples)
    return {
        "n_admissible": n,
        "admissible_exact_match": sum(set(p) == set(t) for p, t, _ in triples) / n,
        "admissible_f1": sum(f1(p, t) for p, t, _ in triples) / n,
        "copy_baseline_admissible_exact_match": sum(set(c) == set(t) for _, t, c in triples) / n,
        "copy_baseline_admissible_f1": sum(f1(c, t) for _, t, c in triples) / n,
    }


def worst_rows(rows: Sequence[dict[str, Any]], n: int = 10) -> list[dict[str, Any]]:
    """The ``n`` worst predictions: malformed first, then reward errors, then lowest F1."""
    return sorted(rows, key=lambda r: (not r["malformed"], not r["reward_error"], r["state_f1"]))[
        :n
    ]


def _reason(error: str) -> str:
    # the parser's message without the offending value: a category to count
    return re.split(r", got| \(", error)[0]


def evaluate_fidelity(
    generate: GenerateFn,
    examples: Sequence[ExperienceExample],
    *,
    with_reasoning: bool,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Generate answers for ``examples`` (one batched call), score them; (summary, table)."""
    start = time.perf_counter()
    outputs = generate([ex.prompt() for ex in examples])
    seconds = time.perf_counter() - start
    if len(outputs) != len(examples):
        raise ValueError(f"{len(outputs)} outputs for {len(examples)} prompts")
    rows = [
        score_prediction(ex, out, with_reasoning) for ex, out in zip(examples, outputs, strict=True)
    ]
    summary = summarize(rows)
    summary["generate_seconds"] = round(seconds, 2)
    summary["examples_per_second"] = round(len(examples) / seconds, 4) if seconds > 0 else 0.0
    return summary, rows
