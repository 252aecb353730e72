"""The experience model's task-generation head: prompts, strict parsers, SFT examples.

The same weights as the experience model write (a) new task variants from a seed task and
(b) the initial state of a task (so a generated task can be played in the synthetic env):

- variant: prompt = family + seed instruction; answer ``<task>new instruction</task>``.
- initial state: prompt = family + instruction + a reference initial state of a task of
  the same family (the parent's, at inference); answer ``<state>initial state</state>``.

SFT examples come from real data only: two different real train tasks of the same family
are a (seed, variant) pair; every real train task's recorded initial state is a
(task -> initial state) pair, with another same-family task's initial state as reference.
Parsers are strict (``MalformedOutputError``): callers drop or resample, never guess.
"""

from __future__ import annotations

import math
import random
import re
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Literal

from components.experience.format import ChatExample, MalformedOutputError
from components.schema import Task, Trajectory, stable_id

Messages = list[dict[str, str]]
GenerateFn = Callable[[list[Messages]], list[str]]
Kind = Literal["variant", "initial_state"]

TASK_SYSTEM_PROMPT = (
    "You are the task generator of a text environment. Write what is asked in the answer "
    "tag only: a new task is a different, feasible goal of the same family as the seed task; "
    "an initial state describes the starting location, the visible objects and the "
    "inventory in the same style as the reference state."
)
TASK_STOP = "</task>"
STATE_STOP = "</state>"
_TASK = re.compile(r"\A\s*<task>(?P<body>.*?)</task>\s*\Z", re.DOTALL)
_STATE = re.compile(r"\A\s*<state>(?P<body>.*?)</state>\s*\Z", re.DOTALL)
_ANY_TAG = re.compile(r"</?(think|state|reward|task|action)>")
GENERATED_PREFIX = "gen"


def variant_prompt(seed: Task) -> Messages:
    """Messages asking for a new task variant of ``seed``."""
    user = (
        "Write a new task of the same family as the seed task.\n\n"
        f"Family: {seed.family}\nSeed task: {seed.instruction.strip()}"
    )
    return [{"role": "system", "content": TASK_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def initial_state_prompt(task: Task, reference_state: str | None, family: str) -> Messages:
    """Messages asking for the initial state of ``task`` (reference: a same-family state)."""
    parts = ["Write the initial state of this task.", f"Family: {family}"]
    if reference_state:
        parts.append(f"Reference initial state of a similar task:\n{reference_state.strip()}")
    parts.append(f"Task: {task.instruction.strip()}")
    user = "\n\n".join(parts)
    return [{"role": "system", "content": TASK_SYSTEM_PROMPT}, {"role": "user", "content": user}]


def render_task(instruction: str) -> str:
    """The answer of the variant head."""
    return f"<task>{instruction.strip()}</task>"


def render_state(state: str) -> str:
    """The answer of the initial-state head."""
    return f"<state>{state.strip()}</state>"


def _parse(pattern: re.Pattern[str], tag: str, text: str) -> str:
    match = pattern.match(text)
    if match is None:
        if f"<{tag}>" not in text:
            raise MalformedOutputError(f"missing <{tag}>")
        if f"</{tag}>" not in text:
            raise MalformedOutputError(f"unclosed <{tag}> (truncated answer?)")
        raise MalformedOutputError(f"text outside <{tag}>")
    body = match.group("body").strip()
    if not body:
        raise MalformedOutputError(f"empty <{tag}>")
    if _ANY_TAG.search(body):
        raise MalformedOutputError(f"nested tag inside <{tag}>")
    return body


def parse_task(text: str) -> str:
    """The instruction of a ``<task>..</task>`` answer; raises MalformedOutputError."""
    return _parse(_TASK, "task", text)


def parse_state(text: str) -> str:
    """The state of a ``<state>..</state>`` answer; raises MalformedOutputError."""
    return _parse(_STATE, "state", text)


@dataclass(frozen=True)
class TaskGenExample(ChatExample):
    """One task-generation SFT record (same shape as the experience model's examples)."""

    id: str
    kind: Kind
    messages: tuple[dict[str, str], ...]
    answer: str


def task_generation_examples(
    tasks: Iterable[Task],
    trajectories: Iterable[Trajectory],
    seed: int = 0,
    limit: int | None = None,
) -> list[TaskGenExample]:
    """SFT examples of both heads from real train data (``limit``: about half per head)."""
    rng = random.Random(seed)
    train = sorted(
        (t for t in tasks if t.split == "train" and not t.generated), key=lambda t: t.task_id
    )
    by_family: dict[str, list[Task]] = defaultdict(list)
    for t in train:
        by_family[t.family].append(t)
    per_kind = None if limit is None else math.ceil(limit / 2)

    variants = [
        TaskGenExample(
            id=stable_id("variant", a.task_id, b.task_id),
            kind="variant",
            messages=tuple(variant_prompt(a)),
            answer=render_task(b.instruction),
        )
        for fam in sorted(by_family)
        for a in by_family[fam]
        for b in by_family[fam]
        if a.task_id != b.task_id and a.instruction.strip() != b.instruction.strip()
    ]
    initial = _initial_states(trajectories, {t.task_id for t in train})
    states = []
    for fam in sorted(by_family):
        known = [t for t in by_family[fam] if t.task_id in initial]
        for t in known:
            others = [o for o in known if o.task_id != t.task_id]
            ref = initial[rng.choice(others).task_id] if others else None
            states.append(
                TaskGenExample(
                    id=stable_id("initial_state", t.task_id),
                    kind="initial_state",
                    messages=tuple(initial_state_prompt(t, ref, fam)),
                    answer=render_state(initial[t.task_id]),
                )
            )
    out: list[TaskGenExample] = []
    for group in (variants, states):
        if per_kind is not None and len(group) > per_kind:
            group = rng.sample(group, per_kind)
        out.extend(group)
    rng.shuffle(out)
    return out[:limit] if limit is not None else out


def _initial_states(trajectories: Iterable[Trajectory], task_ids: set[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    for traj in trajectories:
        if traj.source == "real" and traj.split == "train" and traj.task_id in task_ids:
            out.setdefault(traj.task_id, traj.initial_state)
    return out


_FAMILY_SLUG = re.compile(r"[^A-Za-z0-9_-]+")


def generated_task(parent: Task, instruction: str) -> Task:
    """A generated Task: the parent's family/env/difficulty, a stable id, no game file.

    A variant of a generated task is a variant of its real root task (``parent_task_id``
    always names a real task: the game a synthetic episode starts from).
    """
    if parent.generated and parent.parent_task_id is not None:
        parent = parent.model_copy(update={"task_id": parent.parent_task_id})
    text = " ".join(instruction.split())
    key = stable_id(parent.task_id, text.lower(), n=12)
    return Task(
        # the family is free text (a user's games may say "ifdb/zork"): slugged for the id
        task_id=f"{GENERATED_PREFIX}-{_FAMILY_SLUG.sub('-', parent.family)}-{key}",
        env=parent.env,
        family=parent.family,
        difficulty=parent.difficulty,
        split="train",
        instruction=text,
        seed=int(key[:8], 16),
        game_file=None,
        walkthrough=None,
        generated=True,
        parent_task_id=parent.task_id,
    )


def generate_variants(
    generate_fn: GenerateFn,
    seed_tasks: Sequence[Task],
    n: int,
    *,
    counts: Counter[str] | None = None,
) -> list[Task]:
    """``n`` sampled variants per seed task in one batched call; malformed answers dropped.

    ``generate_fn`` should sample (temperature > 0): the n prompts of a seed are identical.
    Deduplication and well-formedness checks are the curriculum's job
    (``components.curriculum.selection.filter_generated``). ``counts`` (if given) receives
    ``variants_requested`` and ``variants_malformed``.
    """
    if n <= 0 or not seed_tasks:
        return []
    parents = [t for t in seed_tasks for _ in range(n)]
    answers = generate_fn([variant_prompt(t) for t in parents])
    out: list[Task] = []
    malformed = 0
    for parent, text in zip(parents, answers, strict=True):
        try:
            out.append(generated_task(parent, parse_task(text)))
        except MalformedOutputError:
            malformed += 1
    if counts is not None:
        counts["variants_requested"] += len(parents)
        counts["variants_malformed"] += malformed
    return out
