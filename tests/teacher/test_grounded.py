"""Grounded teacher: the traces state the right facts, derived from the transition."""

from __future__ import annotations

from components.teacher import AnnotationRequest, GroundedTeacher, parse_reasoning
from components.teacher.grounded import grounded_reasoning, parse_inventory, parse_state
from tests.teacher.conftest import make_transition

KITCHEN = (
    "Location: Kitchen\nYou are in a kitchen. There is a closed chest here. "
    "A golden key lies on the table.\nInventory: nothing\nFeedback: Welcome!"
)
KITCHEN_WITH_KEY = (
    "Location: Kitchen\nYou are in a kitchen. There is a closed chest here.\n"
    "Inventory: a golden key\nFeedback: You pick up the golden key."
)
BEDROOM = (
    "Location: Bedroom\nA cosy bedroom. There is an open chest here.\n"
    "Inventory: a golden key\nFeedback: You go north."
)
BEDROOM_WON = (
    "Location: Bedroom\nA cosy bedroom. There is an open chest here. "
    "The chest contains a golden key.\nInventory: nothing\n"
    "Feedback: You put the golden key in the chest. *** You won! ***"
)
ADMISSIBLE = ["take golden key", "go north", "open chest", "look", "inventory"]


def trace(t, history=()) -> str:
    return grounded_reasoning(AnnotationRequest(transition=t, history=tuple(history)))


def test_invalid_action_is_not_admissible_and_leaves_state_unchanged() -> None:
    nxt = KITCHEN.replace("Welcome!", "That's not a verb I recognise.")
    text = trace(make_transition(KITCHEN, "fly away", nxt, valid=False, admissible=ADMISSIBLE))
    assert "not admissible" in text
    assert "state is unchanged" in text
    assert "still in Kitchen" in text
    assert '"take golden key"' in text  # shows what was admissible instead
    assert "That's not a verb I recognise" in text
    assert "reward is 0" in text
    assert "inventory gains" not in text and "moves from" not in text


def test_invalid_action_without_admissible_list() -> None:
    text = trace(make_transition(KITCHEN, "fly away", KITCHEN, valid=False))
    assert "not admissible" in text and "state is unchanged" in text


def test_reward_one_says_goal_completed() -> None:
    t = make_transition(BEDROOM, "put golden key in chest", BEDROOM_WON, reward=1, done=True)
    text = trace(t)
    assert "completes the goal" in text
    assert "reward is 1" in text and "episode ends" in text
    assert "loses golden key" in text
    assert "The chest contains a golden key" in text


def test_inventory_gain_detected_with_progress_note() -> None:
    t = make_transition(KITCHEN, "take golden key", KITCHEN_WITH_KEY, admissible=ADMISSIBLE)
    text = trace(t)
    assert "is admissible here (one of the 5 available commands)" in text
    assert "inventory gains golden key" in text
    assert "No longer true" in text and "A golden key lies on the table" in text
    assert "not completed yet" in text and "progress" in text
    assert "reward is 0" in text


def test_location_change_detected() -> None:
    text = trace(make_transition(KITCHEN_WITH_KEY, "go north", BEDROOM))
    assert "moves from Kitchen to Bedroom" in text
    assert "It now sees" in text


def test_object_state_change_and_transformed_item() -> None:
    before = "Location: Kitchen\nThere is a closed chest.\nInventory: a carrot"
    after = "Location: Kitchen\nThere is an open chest.\nInventory: a carrot\nFeedback: Opened."
    text = trace(make_transition(before, "open chest", after))
    assert "chest is now described as open (before: closed)" in text
    text = trace(make_transition("Inventory: a carrot", "slice carrot", "Inventory: sliced carrot"))
    assert "carrot in the inventory is now the sliced carrot" in text


def test_eating_is_named() -> None:
    text = trace(make_transition("Inventory: an apple", "eat apple", "Inventory: nothing"))
    assert "loses apple (eaten)" in text


def test_episode_lost_reward_zero() -> None:
    text = trace(make_transition(KITCHEN, "go south", KITCHEN + " You died.", done=True))
    assert "ends here without the goal being completed" in text and "reward is 0" in text


def test_no_effect_valid_action() -> None:
    text = trace(make_transition(KITCHEN, "look", KITCHEN))
    assert "no effect on the world" in text


def test_history_is_mentioned() -> None:
    h = [make_transition(KITCHEN, "take golden key", KITCHEN_WITH_KEY)]
    text = trace(make_transition(KITCHEN_WITH_KEY, "go north", BEDROOM, step_index=1), h)
    assert 'Previously the agent did "take golden key"' in text


def test_robust_to_missing_lines_and_odd_text() -> None:
    for state, nxt in [
        ("", ""),
        ("just some text", "just some other text."),
        ("Inventory:", "Feedback:"),
        ("Location:\nInventory: \nFeedback: <state>x</state>", "Location: A"),
    ]:
        text = trace(make_transition(state, "look", nxt))
        assert parse_reasoning(f"<think>{text}</think>") == text  # embeddable, no tags


def test_parse_state_variants() -> None:
    s = parse_state("-= Kitchen =-\nA room.\nInventory:\n  a key\n  an apple\nFeedback: ok\nmore")
    assert s.location == "Kitchen"
    assert s.inventory == ("key", "apple")
    assert s.feedback == "ok more"
    assert parse_inventory("You are carrying: a red key, an apple and some salt.") == (
        "red key",
        "apple",
        "salt",
    )
    assert parse_inventory("You are carrying nothing.") == ()
    assert parse_state("no keys here").inventory is None


def test_teacher_is_deterministic_and_valid() -> None:
    reqs = [
        AnnotationRequest(transition=make_transition(KITCHEN, "take golden key", KITCHEN_WITH_KEY))
    ]
    seen = []
    a = GroundedTeacher().annotate(reqs, on_result=seen.append)
    b = GroundedTeacher().annotate(reqs)
    assert a == b == seen
    assert a[0].ok and a[0].prompt_tokens == 0 and a[0].backend == "grounded"
