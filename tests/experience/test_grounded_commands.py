"""Admissible commands composed from a compact TextWorld state (grounded_commands.py)."""

from __future__ import annotations

from components.experience.grounded_commands import CommandRoles, state_commands

ROLES = CommandRoles.learn(
    ["unlock chest with old key", "lock box with latchkey", "eat apple", "take apple", "look"]
)


def _state(surroundings: str, inventory: str = "nothing") -> str:
    return f"Location: Vault\n{surroundings}\nInventory: {inventory}\nFeedback: Hi."


def test_roles_are_the_last_words_of_keys_and_food_in_recorded_commands():
    assert ROLES.keys == {"key", "latchkey"} and ROLES.food == {"apple"}
    assert ROLES.is_key("rusty latchkey") and not ROLES.is_key("key ring holder")
    assert ROLES.is_food("green apple")


def test_commands_follow_what_is_held_open_closed_locked_on_and_in():
    state = _state(
        "Exits: east, north (closed wooden door). The chest is locked. The box is closed. "
        "The safe is open and contains a coin. On the table: a pen. Nothing is on the shelf. "
        "There is a lamp. On the floor: a fried green apple.",
        inventory="a latchkey, an apple",
    )
    held = ("latchkey", "apple")
    expected = {
        "look", "inventory", "go east",  # the north door is closed: no go north
        "examine wooden door", "open wooden door", "lock wooden door with latchkey",
        "examine chest", "unlock chest with latchkey",
        "examine box", "open box", "lock box with latchkey",
        "examine safe", "close safe", "take coin from safe", "examine coin",
        "examine table", "take pen from table", "examine pen", "examine shelf",
        "examine lamp", "take green apple", "examine green apple", "eat apple",
        *(f"{v} {x}" for x in held for v in ("drop", "examine")),
        *(f"insert {x} into safe" for x in held),
        *(f"put {x} on {s}" for x in held for s in ("table", "shelf")),
    }  # fmt: skip
    out = state_commands(state, ROLES)
    assert out == tuple(sorted(expected))


def test_taking_the_key_makes_its_lock_commands_admissible():
    before = state_commands(_state("Exits: west. The box is closed."), ROLES)
    after = state_commands(_state("Exits: west. The box is closed.", "a latchkey"), ROLES)
    assert "lock box with latchkey" not in before
    assert {"lock box with latchkey", "drop latchkey", "open box"} <= set(after)


def test_a_state_that_is_not_a_compact_textworld_state_is_not_composed():
    assert state_commands("You are in a lab. A beaker is here.", ROLES) is None
