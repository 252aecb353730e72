"""The teacher interface: annotation requests, answers, output validation, errors."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from components.schema import Trajectory, Transition

# skipped: not attempted (budget spent or run stopped); it is retried on the next run.
Status = Literal["ok", "failed", "skipped"]
OnResult = Callable[["Annotation"], None]

# Tags of the experience model's target format; the reasoning is embedded between
# <think> and </think>, so none of them may appear inside it.
_FORMAT_TAGS = re.compile(r"</?\s*(think|state|reward)\s*>", re.IGNORECASE)
_THINK = re.compile(r"\A\s*<think>(?P<body>.*?)</think>\s*\Z", re.DOTALL)
MAX_REASONING_CHARS = 6000


class TeacherError(RuntimeError):
    """The teacher cannot go on (bad configuration, authentication, missing model)."""


class BudgetExhaustedError(TeacherError):
    """The cost budget is spent; ``stats`` holds what was done before stopping."""

    def __init__(self, message: str, stats: dict | None = None) -> None:
        super().__init__(message)
        self.stats = stats or {}


class MalformedAnswerError(ValueError):
    """The teacher's answer is not exactly ``<think>reasoning</think>``."""


class AnnotationRequest(BaseModel):
    """One transition to explain, with the steps before it in its episode."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    transition: Transition
    history: tuple[Transition, ...] = ()

    @property
    def id(self) -> str:
        """The transition id (the annotation key)."""
        return self.transition.id


class Annotation(BaseModel):
    """The teacher's answer for one request (``reasoning`` only when ``status == 'ok'``)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    status: Status
    reasoning: str | None = None
    backend: str
    model: str
    prompt_tokens: int = Field(0, ge=0, description="summed over every attempt")
    completion_tokens: int = Field(0, ge=0, description="summed over every attempt")
    cost_usd: float = Field(0.0, ge=0)
    attempts: int = Field(0, ge=0)
    error: str | None = None
    raw: str | None = Field(None, description="excerpt of the last bad answer, for debugging")

    @property
    def ok(self) -> bool:
        """True when the reasoning is valid."""
        return self.status == "ok"


@runtime_checkable
class Teacher(Protocol):
    """Explains transitions: one reasoning trace per request, failures reported, not raised."""

    backend: str
    model: str
    batch_size: int  # requests per annotate() call that keep the backend busy

    @property
    def budget_exhausted(self) -> bool:
        """True once the backend refused work for lack of budget."""
        ...

    def annotate(
        self, batch: Sequence[AnnotationRequest], on_result: OnResult | None = None
    ) -> list[Annotation]:
        """Annotate a batch (same order); ``on_result`` sees each answer as soon as it exists."""
        ...


def parse_reasoning(text: str) -> str:
    """Extract the reasoning from ``<think>...</think>``; raises MalformedAnswerError."""
    m = _THINK.match(text or "")
    if m is None:
        raise MalformedAnswerError("answer is not exactly <think>...</think>")
    body = m.group("body").strip()
    if not body:
        raise MalformedAnswerError("empty reasoning")
    if _FORMAT_TAGS.search(body):
        raise MalformedAnswerError("reasoning contains a <think>/<state>/<reward> tag")
    if len(body) > MAX_REASONING_CHARS:
        raise MalformedAnswerError(f"reasoning longer than {MAX_REASONING_CHARS} chars")
    return body


def strip_format_tags(text: str) -> str:
    """Remove target-format tags from quoted environment text."""
    # until stable: removing one tag can join the halves of another ("<thi<think>nk>")
    while True:
        out = _FORMAT_TAGS.sub("", text)
        if out == text:
            return out
        text = out


def excerpt(text: str | None, n: int = 300) -> str | None:
    """A short excerpt of a possibly long text (None stays None)."""
    if text is None:
        return None
    return text if len(text) <= n else text[:n] + "..."


def answer(
    req: AnnotationRequest,
    status: Status,
    teacher: Teacher,
    tokens: Sequence[int],
    attempts: int,
    *,
    reasoning: str | None = None,
    error: str | None = None,
    raw: str | None = None,
    cost_usd: float = 0.0,
    redact: Callable[[str], str] | None = None,
) -> Annotation:
    """The annotation of ``req`` by ``teacher`` (its backend and model): ``tokens`` is
    (prompt, completion) over every attempt; the reasoning, the error and an excerpt of
    ``raw`` pass through ``redact`` when given (a server may echo the key back)."""
    clean = redact or str
    return Annotation(
        id=req.id,
        status=status,
        reasoning=None if reasoning is None else clean(reasoning),
        backend=teacher.backend,
        model=teacher.model,
        prompt_tokens=tokens[0],
        completion_tokens=tokens[1],
        cost_usd=cost_usd,
        attempts=attempts,
        error=None if error is None else clean(error),
        raw=None if raw is None else excerpt(clean(raw)),  # a key cut short would not match
    )


def iter_requests(
    trajectories: Iterable[Trajectory], history_len: int
) -> Iterator[AnnotationRequest]:
    """One request per transition, in order, each with its last ``history_len`` steps."""
    for traj in trajectories:
        for i, step in enumerate(traj.steps):
            lo = max(0, i - history_len)
            yield AnnotationRequest(transition=step, history=tuple(traj.steps[lo:i]))
