"""Seed selection, generated-task filtering and the lambda mix of each task batch.

- seeds: the tasks of highest reward variance (ties: more rollouts, then task id), above
  ``min_variance`` (a task always failed or always solved teaches nothing).
- generated tasks are kept only if well-formed (non-empty, length bounds, printable, not
  the parent's text) and new: deduplicated on normalised text against each other and
  against every existing task.
- lambda caps the generated share EXACTLY: a batch of B tasks holds
  min(floor(lambda * B), available) generated tasks, the rest real ones.
- frontier order: generated tasks whose last group had mixed outcomes first; one whose
  last group tied is retired (it teaches GRPO nothing, and most such variants are
  unwinnable in the dream), so its slot goes to a real task.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence

from components.curriculum.variance import GroupStats
from components.schema import Task

_NON_ALNUM = re.compile(r"[^a-z0-9]+")
REJECT_EMPTY = "empty"
REJECT_SHORT = "too_short"
REJECT_LONG = "too_long"
REJECT_UNPRINTABLE = "unprintable"
REJECT_SAME_AS_PARENT = "same_as_parent"
REJECT_DUPLICATE = "duplicate"
REJECT_EXISTING = "existing_task"
REJECT_NO_PARENT = "no_parent"


def normalize_text(text: str) -> str:
    """Lower case, punctuation and whitespace collapsed: the dedupe key of a task."""
    return _NON_ALNUM.sub(" ", text.lower()).strip()


def select_seeds(stats: Mapping[str, GroupStats], k: int, min_variance: float = 0.0) -> list[str]:
    """The ``k`` task ids of highest variance (strictly above ``min_variance``)."""
    eligible = [(tid, s) for tid, s in stats.items() if s.variance > min_variance]
    eligible.sort(key=lambda kv: (-kv[1].variance, -kv[1].n, kv[0]))
    return [tid for tid, _ in eligible[:k]]


def well_formed(task: Task, parent: Task | None, min_chars: int, max_chars: int) -> str | None:
    """Why a generated task is unusable (a reject reason), or None when it is fine."""
    text = task.instruction.strip()
    if not text:
        return REJECT_EMPTY
    if not text.isprintable():
        return REJECT_UNPRINTABLE
    if len(text) < min_chars:
        return REJECT_SHORT
    if len(text) > max_chars:
        return REJECT_LONG
    if parent is None:
        return REJECT_NO_PARENT
    if normalize_text(text) == normalize_text(parent.instruction):
        return REJECT_SAME_AS_PARENT
    return None


def filter_generated(
    candidates: Iterable[Task],
    existing: Iterable[Task],
    *,
    min_chars: int,
    max_chars: int,
) -> tuple[list[Task], Counter[str]]:
    """Well-formed candidates that are new (vs each other and ``existing``), and reject counts."""
    pool = list(existing)
    by_id = {t.task_id: t for t in pool}
    seen = {normalize_text(t.instruction) for t in pool}
    kept: list[Task] = []
    rejected: Counter[str] = Counter()
    for task in candidates:
        by_id_parent = by_id.get(task.parent_task_id or "")
        reason = well_formed(task, by_id_parent, min_chars, max_chars)
        key = normalize_text(task.instruction)
        if reason is None and key in seen:
            existing_match = any(normalize_text(t.instruction) == key for t in pool)
            reason = REJECT_EXISTING if existing_match else REJECT_DUPLICATE
        if reason is not None:
            rejected[reason] += 1
            continue
        seen.add(key)
        kept.append(task)
    return kept, rejected


def frontier_order(
    generated: Sequence[Task], new: Sequence[Task], last_variance: Mapping[str, float]
) -> tuple[list[Task], list[Task]]:
    """(eligible, retired) generated tasks: mixed last group, then ``new``, then untried.

    ``last_variance`` maps a task id to its last group's reward variance; a task absent
    from it was never played. ``new`` tasks are not in ``generated`` yet.
    """
    played = [t for t in generated if t.task_id in last_variance]
    mixed = [t for t in played if last_variance[t.task_id] > 0]
    retired = [t for t in played if last_variance[t.task_id] <= 0]
    untried = [t for t in generated if t.task_id not in last_variance]
    return [*mixed, *new, *untried], retired


def subsample_tasks(tasks: Sequence[Task], n: int, seed: int = 0) -> list[Task]:
    """``n`` of ``tasks`` at random (all when ``n`` is 0 or too large); order-independent."""
    if n <= 0 or n >= len(tasks):
        return list(tasks)
    return random.Random(seed).sample(sorted(tasks, key=lambda t: t.task_id), n)


def n_generated_slots(batch_size: int, lambda_generated: float) -> int:
    """floor(lambda * batch_size): the most generated tasks a batch may hold."""
    # round first: 0.3 * 10 is 2.9999999999999996 in floating point
    return math.floor(round(lambda_generated * batch_size, 9))


def mix_batch(
    real: Sequence[Task],
    generated: Sequence[Task],
    batch_size: int,
    lambda_generated: float,
    seed: int,
    pick_real: Callable[[int], list[Task]] | None = None,
) -> list[Task]:
    """A task batch of ``batch_size``: at most floor(lambda * B) generated, the rest real.

    Generated tasks are taken in the given order (put the newest / best seeded first); real
    tasks are sampled without replacement (cycling when the batch is larger than the set),
    or chosen by ``pick_real(n)`` (e.g. the reward-variance sampler).
    """
    if not real:
        raise ValueError("a batch needs real tasks (generated ones are capped by lambda)")
    rng = random.Random(seed)
    n_gen = min(n_generated_slots(batch_size, lambda_generated), len(generated))
    picked_gen = list(generated[:n_gen])
    n_real = batch_size - n_gen
    picked_real: list[Task] = pick_real(n_real) if pick_real is not None else []
    while len(picked_real) < n_real:
        order = list(real)
        rng.shuffle(order)
        picked_real.extend(order[: n_real - len(picked_real)])
    batch = picked_real + picked_gen
    rng.shuffle(batch)
    return batch
