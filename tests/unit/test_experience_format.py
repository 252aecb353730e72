"""Experience-model format: targets round-trip, malformed answers are named, not guessed."""

from __future__ import annotations

import pytest

from components.experience.format import (
    MalformedOutputError,
    StepContext,
    history_pairs,
    parse_answer,
    render_answer,
    render_prompt,
)
from tests.factories import make_trajectory


def test_answer_round_trips_with_and_without_reasoning():
    text = render_answer("Location: Kitchen", 1, "The door is open, so going east works.")
    p = parse_answer(text)
    assert (p.next_state, p.reward) == ("Location: Kitchen", 1)
    assert p.reasoning.startswith("The door")
    bare = render_answer("Location: Hall", 0, None)
    assert "<think>" not in bare
    assert parse_answer(bare, with_reasoning=False).reasoning is None


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("<think>x</think><state>s</state>", "missing <reward>"),
        ("<think>x</think><state>s</state><reward>1", "unclosed <reward>"),
        ("<think>x</think><state>s</state><reward>yes</reward>", "reward must be 0 or 1"),
        ("<think>x</think><state>s</state><reward>0.5</reward>", "reward must be 0 or 1"),
        ("<think>x</think><state> </state><reward>0</reward>", "empty <state>"),
        ("<think> </think><state>s</state><reward>0</reward>", "empty <think>"),
        ("Sure! <think>x</think><state>s</state><reward>0</reward>", "text outside"),
        ("<state>s</state><think>x</think><reward>0</reward>", "out of order"),
        ("<think>x</think><state>s<state>t</state><reward>0</reward>", "nested tag"),
        ("", "missing <think>"),
    ],
)
def test_malformed_answers_are_reported_with_the_reason(text: str, reason: str):
    with pytest.raises(MalformedOutputError, match=reason):
        parse_answer(text)


def test_reasoning_ablation_rejects_a_think_block():
    with pytest.raises(MalformedOutputError, match="unexpected <think>"):
        parse_answer("<think>x</think><state>s</state><reward>0</reward>", with_reasoning=False)


def test_prompt_sections_follow_the_ablation_switches():
    traj = make_trajectory(n_steps=4)
    full = StepContext(
        instruction=traj.steps[2].instruction,
        state=traj.steps[2].state,
        action=traj.steps[2].action,
        history=history_pairs(traj.steps[:2], history_len=2),
        retrieved=(traj.steps[0],),
    )
    text = render_prompt(full)
    assert "Recent history" in text and "Similar past transitions" in text
    bare = render_prompt(StepContext(full.instruction, full.state, full.action))
    assert "Recent history" not in bare and "Similar past transitions" not in bare
    assert history_pairs(traj.steps[:3], history_len=0) == ()
    assert len(history_pairs(traj.steps[:3], history_len=2)) == 2
