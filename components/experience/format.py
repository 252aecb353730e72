"""Prompt and answer format of the experience model, and its strict parser.

Input: the task, the last ``history_len`` steps, the current state, the agent's action
and k retrieved transitions. Answer:
``<think>R_t</think><state>s_{t+1}</state><reward>0|1</reward>`` (no ``<think>`` block
in the "w/o reasoning" ablation). The parser never guesses: anything else is malformed
and reported with the reason, so callers can count it, resample once, then fail the
episode.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from components.schema import Transition

SYSTEM_PROMPT = (
    "You are the world model of a text environment. Given the task, the recent history, "
    "the current state, the agent's action and similar past transitions, reason about "
    "whether the action is valid and what it changes, then predict the next state and "
    "the reward (1 only if the task is now completed, otherwise 0). An invalid action "
    "leaves the state unchanged with reward 0."
)
_ANSWER_WITH = re.compile(
    r"\A\s*<think>(?P<think>.*?)</think>\s*<state>(?P<state>.*?)</state>\s*"
    r"<reward>\s*(?P<reward>[^<]*?)\s*</reward>\s*\Z",
    re.DOTALL,
)
_ANSWER_WITHOUT = re.compile(
    r"\A\s*<state>(?P<state>.*?)</state>\s*<reward>\s*(?P<reward>[^<]*?)\s*</reward>\s*\Z",
    re.DOTALL,
)
_TAG = re.compile(r"</?(think|state|reward)>")


class MalformedOutputError(ValueError):
    """The model's answer does not follow the format; the message says how."""


@dataclass(frozen=True)
class Prediction:
    """A parsed experience-model answer."""

    reasoning: str | None
    next_state: str
    reward: int


@dataclass(frozen=True)
class StepContext:
    """Everything the experience model sees for one step."""

    instruction: str
    state: str
    action: str
    history: tuple[tuple[str, str], ...] = ()  # (action, resulting state) pairs, oldest first
    retrieved: tuple[Transition, ...] = ()


def render_prompt(ctx: StepContext) -> str:
    """The user message for one step (history and retrieved sections only when present)."""
    parts = [f"Task: {ctx.instruction}"]
    if ctx.retrieved:
        examples = "\n".join(
            f"- state: {t.state}\n  action: {t.action}\n  next state: {t.next_state}\n"
            f"  reward: {t.reward}"
            for t in ctx.retrieved
        )
        parts.append(f"Similar past transitions:\n{examples}")
    if ctx.history:
        steps = "\n".join(f"- action: {a}\n  result: {s}" for a, s in ctx.history)
        parts.append(f"Recent history:\n{steps}")
    parts.append(f"Current state:\n{ctx.state}")
    parts.append(f"Action: {ctx.action}")
    return "\n\n".join(parts)


def render_answer(next_state: str, reward: int, reasoning: str | None) -> str:
    """The training target for one step (``reasoning=None``: the w/o-reasoning ablation)."""
    think = f"<think>{reasoning.strip()}</think>" if reasoning is not None else ""
    return f"{think}<state>{next_state.strip()}</state><reward>{int(reward)}</reward>"


def parse_answer(text: str, with_reasoning: bool = True) -> Prediction:
    """Parse an answer strictly; raises MalformedOutputError naming the problem."""
    match = (_ANSWER_WITH if with_reasoning else _ANSWER_WITHOUT).match(text)
    if match is None:
        raise MalformedOutputError(_diagnose(text, with_reasoning))
    groups = match.groupdict()
    reward_text = groups["reward"].strip()
    if reward_text not in ("0", "1"):
        raise MalformedOutputError(f"reward must be 0 or 1, got {reward_text!r}")
    state = groups["state"].strip()
    if not state:
        raise MalformedOutputError("empty <state>")
    for name in ("think", "state"):
        if groups.get(name) and _TAG.search(groups[name]):
            raise MalformedOutputError(f"nested tag inside <{name}>")
    reasoning = groups["think"].strip() if with_reasoning else None
    if with_reasoning and not reasoning:
        raise MalformedOutputError("empty <think>")
    return Prediction(reasoning=reasoning, next_state=state, reward=int(reward_text))


def _diagnose(text: str, with_reasoning: bool) -> str:
    required = ("think", "state", "reward") if with_reasoning else ("state", "reward")
    for tag in required:
        if f"<{tag}>" not in text:
            return f"missing <{tag}>"
        if f"</{tag}>" not in text:
            return f"unclosed <{tag}> (truncated answer?)"
    if not with_reasoning and "<think>" in text:
        return "unexpected <think> (reasoning is disabled)"
    return "tags out of order or text outside the tags"


def history_pairs(steps: Sequence[Transition], history_len: int) -> tuple[tuple[str, str], ...]:
    """The last ``history_len`` (action, next state) pairs of an episode prefix."""
    if history_len <= 0:
        return ()
    return tuple((s.action, s.next_state) for s in steps[-history_len:])
