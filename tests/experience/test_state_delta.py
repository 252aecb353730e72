"""The delta state target: encode/decode are exact inverses; anything else is malformed."""

from __future__ import annotations

import pytest

from components.experience.format import (
    STATE_DELTA,
    UNCHANGED,
    WHOLE,
    MalformedOutputError,
    StepContext,
    decode_state,
    encode_state,
    parse_answer,
    render_answer,
    render_prompt,
)
from tests.factories import make_trajectory

STATE = "Location: Kitchen\nExits: north. On the table: an apple.\nInventory: nothing\nFeedback: -"
TAKEN = (
    "Location: Kitchen\nExits: north. Nothing is on the table.\n"
    "Inventory: an apple\nFeedback: Taken."
)


def test_delta_holds_only_changed_lines_and_decodes_back():
    delta = encode_state(STATE, TAKEN, STATE_DELTA)
    assert delta == "Exits: north. Nothing is on the table.\nInventory: an apple\nFeedback: Taken."
    assert decode_state(STATE, delta, STATE_DELTA) == TAKEN
    assert encode_state(STATE, STATE, STATE_DELTA) == UNCHANGED
    assert decode_state(STATE, UNCHANGED, STATE_DELTA) == STATE


def test_unkeyed_or_reshaped_states_are_written_whole():
    assert encode_state("a room", "another room", STATE_DELTA) == "another room"
    extra = TAKEN + "\nScore: 1"
    assert encode_state(STATE, extra, STATE_DELTA) == f"{WHOLE}\n{extra}"
    assert decode_state(STATE, extra, STATE_DELTA) == extra  # covers every line: a whole state


@pytest.mark.parametrize(
    "after",
    [
        "Location: Kitchen\nInventory: an apple",  # fewer keys: not a delta of two lines
        "Inventory: nothing\nLocation: Kitchen\nFeedback: -\nExits: north.",  # reordered
    ],
)
def test_a_whole_state_with_other_keys_decodes_back_exactly(after: str):
    assert decode_state(STATE, encode_state(STATE, after, STATE_DELTA), STATE_DELTA) == after
    with pytest.raises(MalformedOutputError, match="no state"):
        decode_state(STATE, WHOLE, STATE_DELTA)  # the marker alone is no state


def test_a_delta_with_an_unknown_key_is_malformed_not_guessed():
    with pytest.raises(MalformedOutputError, match="Score"):
        decode_state(STATE, "Score: 3", STATE_DELTA)
    answer = "<think>ok</think><state>Score: 3</state><reward>0</reward>"
    with pytest.raises(MalformedOutputError):
        parse_answer(answer, state=STATE, state_target=STATE_DELTA)


def test_answer_round_trip_and_full_target_unchanged():
    answer = render_answer(TAKEN, 0, "Valid.", state=STATE, state_target=STATE_DELTA)
    assert "Location" not in answer
    assert parse_answer(answer, state=STATE, state_target=STATE_DELTA).next_state == TAKEN
    full = render_answer(TAKEN, 0, "Valid.")
    assert parse_answer(full).next_state == TAKEN


def test_delta_prompt_shows_changes_not_whole_next_states():
    traj = make_trajectory(n_steps=2)
    t = traj.steps[0]
    ctx = StepContext(instruction="eat", state=STATE, action="take apple", retrieved=(t,))
    text = render_prompt(ctx, STATE_DELTA)
    assert "changes:" in text and "next state:" not in text
    hist = StepContext(instruction="eat", state=TAKEN, action="eat", history=(("take", TAKEN),))
    assert "result: same as the current state" in render_prompt(hist, STATE_DELTA)
