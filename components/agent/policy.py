"""Prompt and answer format of the agent policy, and its strict parser.

Input: the task, the last ``history_len`` (action, feedback) steps, the current state and,
where the env has them, the admissible actions. Answer:
``<think>reasoning</think><action>one command</action>`` (no ``<think>`` block when
reasoning is off). The parser never guesses: anything else raises MalformedActionError,
which callers count and turn into the env's invalid-action path.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from components.experience.format import checked_reasoning, diagnose_tags

SYSTEM_PROMPT = (
    "You are an agent acting in a text environment. Read the task, the recent history, the "
    "current state and the admissible actions, think briefly about the next step toward the "
    "goal, then answer with exactly one action."
)
ACTION_STOP = "</action>"  # generation stops here
_WITH = re.compile(
    r"\A\s*<think>(?P<think>.*?)</think>\s*<action>(?P<action>.*?)</action>\s*\Z", re.DOTALL
)
_WITHOUT = re.compile(r"\A\s*<action>(?P<action>.*?)</action>\s*\Z", re.DOTALL)
_TAG = re.compile(r"</?(think|action)>")
_WS = re.compile(r"\s+")
MAX_ACTION_CHARS = 200  # longer "actions" are degenerate generations, not commands


class MalformedActionError(ValueError):
    """The policy's answer does not follow the format; the message says how."""


@dataclass(frozen=True)
class PolicySettings:
    """What the policy sees and answers (fixed at training, reused at inference)."""

    history_len: int = 2
    with_reasoning: bool = True
    show_admissible: bool = True
    max_admissible: int = 40  # long lists are cut (after sorting) to bound the prompt


FEEDBACK_PREFIX = "Feedback:"  # last line of an abstract state (components/envs)


def feedback_of(state: str) -> str:
    """The env's answer to the last action: the state's ``Feedback:`` line (else the state)."""
    for line in reversed(state.splitlines()):
        if line.startswith(FEEDBACK_PREFIX):
            return line[len(FEEDBACK_PREFIX) :].strip()
    return state.strip()


@dataclass(frozen=True)
class Observation:
    """Everything the policy sees for one decision.

    ``history`` is the whole episode so far as (action, resulting state) pairs, oldest
    first, and ``initial_state`` the state it started from: the same record in offline
    data, real rollouts, synthetic rollouts and evaluation. What a policy shows of it is
    its own business (the LM prompt: the last ``history_len`` actions and feedbacks; the
    scoring policy: a memory of the whole episode).
    """

    instruction: str
    state: str
    history: tuple[tuple[str, str], ...] = ()
    admissible: tuple[str, ...] | None = None
    initial_state: str | None = None

    def then(self, action: str, result: str, admissible: Sequence[str] | None) -> Observation:
        """The next decision's observation after ``action`` led to ``result``."""
        return Observation(
            instruction=self.instruction,
            state=result,
            history=(*self.history, (action, result)),
            admissible=tuple(admissible) if admissible else None,
            initial_state=self.initial_state if self.initial_state is not None else self.state,
        )


@dataclass(frozen=True)
class Decision:
    """A parsed policy answer."""

    action: str
    reasoning: str | None


def render_prompt(obs: Observation, settings: PolicySettings) -> list[dict[str, str]]:
    """System + user chat messages for one decision."""
    parts = [f"Task: {obs.instruction}"]
    history = obs.history[-settings.history_len :] if settings.history_len > 0 else ()
    if history:
        steps = "\n".join(f"- {a} -> {feedback_of(s)}" for a, s in history)
        parts.append(f"Recent history:\n{steps}")
    parts.append(f"Current state:\n{obs.state}")
    if settings.show_admissible and obs.admissible:
        actions = sorted(obs.admissible)[: settings.max_admissible]
        parts.append("Admissible actions: " + "; ".join(actions))
    user = "\n\n".join(parts)
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": user}]


def render_answer(action: str, reasoning: str | None) -> str:
    """The training target for one decision (``reasoning=None``: no think block)."""
    think = f"<think>{reasoning.strip()}</think>" if reasoning is not None else ""
    return f"{think}<action>{action.strip()}</action>"


def parse_answer(text: str, with_reasoning: bool = True) -> Decision:
    """Parse an answer strictly; raises MalformedActionError naming the problem."""
    match = (_WITH if with_reasoning else _WITHOUT).match(text)
    if match is None:
        raise MalformedActionError(diagnose_tags(text, ("action",), with_reasoning))
    groups = match.groupdict()
    action = _WS.sub(" ", groups["action"]).strip()
    if not action:
        raise MalformedActionError("empty <action>")
    if not action.isprintable():
        raise MalformedActionError("non-printable character in <action>")
    if len(action) > MAX_ACTION_CHARS:
        raise MalformedActionError(f"action longer than {MAX_ACTION_CHARS} characters")
    reasoning = checked_reasoning(groups, "action", with_reasoning, _TAG, MalformedActionError)
    return Decision(action=action, reasoning=reasoning)


def expert_reasoning(action: str, admissible: Sequence[str] | None) -> str:
    """A short, truthful reasoning for an SFT target built from a recorded action."""
    if admissible is not None and action not in admissible:
        return f"'{action}' is not among the admissible actions, but it is my best guess."
    return f"The next step toward the goal is '{action}'."
