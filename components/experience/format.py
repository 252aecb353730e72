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
from typing import Any

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
# a state line "Key: value" (TextWorld's compact states, ScienceWorld's sections)
_KEYED = re.compile(r"\A(?P<key>[A-Z][A-Za-z ]{0,30}):")

# What <state> holds: the whole next state, or only its changed "Key: value" lines (a
# tiny model copies four lines badly but learns which one changes quickly; measured in
# bench/results/experience_model_choice.json). Decoding is exact, never a guess.
STATE_FULL = "full"
STATE_DELTA = "delta"
STATE_TARGETS = (STATE_FULL, STATE_DELTA)
UNCHANGED = "unchanged"
# first line of a delta answer that is a whole state (its keys differ from the current
# state's): without it a whole state with fewer or reordered keys read as a delta
WHOLE = "whole state"


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


def _keyed_lines(state: str) -> list[tuple[str, str]] | None:
    """(key, line) per line when every line is "Key: value" with unique keys, else None."""
    lines = state.strip().splitlines()
    keys = [m.group("key") if (m := _KEYED.match(ln)) else None for ln in lines]
    if not lines or None in keys or len(set(keys)) != len(keys):
        return None
    return list(zip(keys, lines, strict=True))  # type: ignore[arg-type]


def encode_state(state: str, next_state: str, target: str = STATE_FULL) -> str:
    """What <state> holds for ``next_state``: all of it, or the lines that differ.

    A delta needs both states keyed line by line with the same keys in the same order;
    otherwise (and for ``full``) the whole next state is written, after a ``WHOLE`` line
    where both are keyed (else it would read as a delta).
    """
    if target == STATE_FULL:
        return next_state.strip()
    _check_target(target)
    before, after = _keyed_lines(state), _keyed_lines(next_state)
    if before is None or after is None:
        return next_state.strip()  # unkeyed: read back whole
    if [k for k, _ in before] != [k for k, _ in after]:
        return f"{WHOLE}\n{next_state.strip()}"
    changed = [new for (_, old), (_, new) in zip(before, after, strict=True) if old != new]
    return "\n".join(changed) if changed else UNCHANGED


def decode_state(state: str, predicted: str, target: str = STATE_FULL) -> str:
    """The full next state from what <state> holds (inverse of ``encode_state``).

    Delta lines replace the current state's lines with the same key. A prediction with a
    key the current state lacks is a whole state when it covers every line; anything
    else is malformed (never guessed).
    """
    predicted = predicted.strip()
    if target == STATE_FULL:
        return predicted
    _check_target(target)
    if predicted == UNCHANGED:
        return state.strip()
    head, _, whole = predicted.partition("\n")
    if head.strip() == WHOLE:
        if not whole.strip():
            raise MalformedOutputError(f"'{WHOLE}' with no state after it")
        return whole.strip()
    before, delta = _keyed_lines(state), _keyed_lines(predicted)
    if before is None or delta is None:
        return predicted  # an unkeyed state is always written whole
    current = dict(before)
    unknown = [k for k, _ in delta if k not in current]
    if unknown:
        if len(delta) >= len(before):
            return predicted
        raise MalformedOutputError(f"delta line for {unknown[0]!r}, not in the current state")
    current.update(delta)
    return "\n".join(current[k] for k, _ in before)


def _check_target(target: str) -> None:
    if target not in STATE_TARGETS:
        raise ValueError(f"unknown state target {target!r}; known: {STATE_TARGETS}")


def _changes_since(result: str, state: str, target: str) -> str:
    """A history step's result as shown in the prompt (delta: how it differs from now)."""
    if target == STATE_FULL:
        return result
    diff = encode_state(state, result, target)
    return "same as the current state" if diff == UNCHANGED else diff


def render_prompt(ctx: StepContext, state_target: str = STATE_FULL) -> str:
    """The user message for one step (history and retrieved sections only when present)."""
    parts = [f"Task: {ctx.instruction}"]
    if ctx.retrieved:
        label = "next state" if state_target == STATE_FULL else "changes"
        examples = "\n".join(
            f"- state: {t.state}\n  action: {t.action}\n"
            f"  {label}: {encode_state(t.state, t.next_state, state_target)}\n"
            f"  reward: {t.reward}"
            for t in ctx.retrieved
        )
        parts.append(f"Similar past transitions:\n{examples}")
    if ctx.history:
        steps = "\n".join(
            f"- action: {a}\n  result: {_changes_since(s, ctx.state, state_target)}"
            for a, s in ctx.history
        )
        parts.append(f"Recent history:\n{steps}")
    parts.append(f"Current state:\n{ctx.state}")
    parts.append(f"Action: {ctx.action}")
    return "\n\n".join(parts)


def render_answer(
    next_state: str,
    reward: int,
    reasoning: str | None,
    *,
    state: str = "",
    state_target: str = STATE_FULL,
) -> str:
    """The training target for one step (``reasoning=None``: the w/o-reasoning ablation)."""
    think = f"<think>{reasoning.strip()}</think>" if reasoning is not None else ""
    body = encode_state(state, next_state, state_target)
    return f"{think}<state>{body}</state><reward>{int(reward)}</reward>"


def parse_answer(
    text: str, with_reasoning: bool = True, *, state: str = "", state_target: str = STATE_FULL
) -> Prediction:
    """Parse an answer strictly (a delta is applied to ``state``); malformed raises."""
    match = (_ANSWER_WITH if with_reasoning else _ANSWER_WITHOUT).match(text)
    if match is None:
        raise MalformedOutputError(diagnose_tags(text, ("state", "reward"), with_reasoning))
    groups = match.groupdict()
    reward_text = groups["reward"].strip()
    if reward_text not in ("0", "1"):
        raise MalformedOutputError(f"reward must be 0 or 1, got {reward_text!r}")
    body = groups["state"].strip()
    if not body:
        raise MalformedOutputError("empty <state>")
    reasoning = checked_reasoning(groups, "state", with_reasoning, _TAG, MalformedOutputError)
    next_state = decode_state(state, body, state_target)
    return Prediction(reasoning=reasoning, next_state=next_state, reward=int(reward_text))


def assistant_turn(text: str) -> list[dict[str, str]]:
    """``text`` as the one assistant message of a chat record."""
    return [{"role": "assistant", "content": text}]


class ChatPrompt:
    """A chat-format training record's prompt: ``messages`` (system + user)."""

    messages: tuple[dict[str, str], ...]

    def prompt(self) -> list[dict[str, str]]:
        """The prompt messages as a fresh list (for generation)."""
        return [dict(m) for m in self.messages]


class ChatExample(ChatPrompt):
    """A chat-format SFT example: the prompt ``messages`` answered by ``answer``."""

    answer: str

    def to_sft(self) -> dict[str, Any]:
        """The conversational prompt/completion record TRL trains on (completion-only loss)."""
        return {"prompt": self.prompt(), "completion": assistant_turn(self.answer)}


def checked_reasoning(
    groups: dict[str, Any],
    body: str,
    with_reasoning: bool,
    tags: re.Pattern[str],
    error: type[ValueError],
) -> str | None:
    """The ``<think>`` text of a parsed answer (None without reasoning); ``error`` if it or
    the ``<body>`` part holds one of the answer's ``tags``, or if the reasoning is empty."""
    for name in ("think", body):
        if groups.get(name) and tags.search(groups[name]):
            raise error(f"nested tag inside <{name}>")
    reasoning = groups["think"].strip() if with_reasoning else None
    if with_reasoning and not reasoning:
        raise error("empty <think>")
    return reasoning


def diagnose_tags(text: str, tags: Sequence[str], with_reasoning: bool) -> str:
    """Why ``text`` is not a well-formed answer with ``tags`` (after ``<think>`` when
    ``with_reasoning``): the first missing or unclosed tag, else a stray or misplaced one."""
    required = ("think", *tags) if with_reasoning else tuple(tags)
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
