"""ScienceWorld's state edits and fixed answers, on states recorded from the real env."""

from __future__ import annotations

from functools import partial

from components.experience.grounded import GroundedModel, GroundedSettings
from components.experience.grounded_science import science_rule
from components.experience.grounded_science_edits import (
    ACTIVATE,
    MOVE,
    POUR,
    PUT_DOWN,
    TAKE,
    base_name,
    display_name,
    find,
    look_answer,
    science_edit,
    science_feedback,
    science_names,
)
from components.memory import EpisodeMemory
from tests.factories import make_step, make_task, trajectory_of

GREENHOUSE = (
    "Here: a bee hive. The bee hive door is closed; "
    "a flower pot 1 (containing a peach tree in the reproducing stage, soil); "
    "a flower pot 6 (containing a apple tree in the reproducing stage, soil); "
    "a flower pot 8 (containing nothing); a shovel; A door to the hallway (that is closed)"
)
POT_6 = "a flower pot 6 (containing a apple tree in the reproducing stage, soil)"
ART = (
    "Here: a large cupboard. The large cupboard door is closed; a table. On the table is: "
    "a jug (containing red paint); a wood cup (containing nothing); "
    "a wood cup (containing blue paint); a wood cup (containing yellow paint); "
    "A door to the hallway (that is open)"
)


def test_pick_up_takes_the_item_with_its_contents_into_the_sorted_inventory() -> None:
    here, inv = science_edit(TAKE, GREENHOUSE, "an orange", "flower pot 6", "")
    assert POT_6 not in here and "a flower pot 1 (containing a peach tree" in here
    assert inv == f"{POT_6} an orange"  # ScienceWorld lists the inventory by name
    assert science_edit(TAKE, GREENHOUSE, "an orange", "shovel", "")[1] == "an orange a shovel"


def test_pick_up_out_of_a_named_container_leaves_the_container() -> None:
    here, inv = science_edit(TAKE, GREENHOUSE, "an orange", "soil", "flower pot 1")
    assert "a flower pot 1 (containing a peach tree in the reproducing stage);" in here
    assert POT_6 in here  # the other pot keeps its soil
    assert inv == "an orange soil"


def test_an_item_with_sentences_is_carried_with_each_sentence_closed() -> None:
    room = "Here: a closet. The closet door is closed; a table. On the table is: nothing"
    assert science_edit(TAKE, room, "an orange", "closet", "")[1] == (
        "a closet. The closet door is closed. an orange"
    )


def test_put_down_lists_the_item_in_the_room_before_the_doors() -> None:
    room = "Here: a glass cup (containing nothing); a painting; A door to the hall (that is open)"
    here, inv = science_edit(PUT_DOWN, room, "an orange", "orange", "")
    assert here == (
        "Here: a glass cup (containing nothing); an orange; a painting; "
        "A door to the hall (that is open)"
    )
    assert inv == "nothing"


def test_move_from_the_inventory_into_a_box_in_the_room() -> None:
    room = "Here: a painting; a red box (containing nothing); A door to the hall (that is open)"
    here, inv = science_edit(
        MOVE, room, "an orange a turtle egg", "egg turtle egg in inventory", "red box"
    )
    assert "a red box (containing a turtle egg)" in here
    assert inv == "an orange"


def test_move_into_a_box_carried_in_the_inventory() -> None:
    inv = "a crocodile egg an orange a orange box (containing nothing)"
    _, after = science_edit(MOVE, "Here: a table", inv, "egg crocodile egg in inventory", "box")
    assert after == "an orange a orange box (containing a crocodile egg)"


def test_pour_moves_the_contents_the_reference_names_and_empties_the_cup() -> None:
    here, _ = science_edit(
        POUR, ART, "an orange", "cup containing yellow paint", "art studio in jug"
    )
    assert "a jug (containing red paint, yellow paint)" in here
    assert "a wood cup (containing blue paint)" in here  # not the blue one
    assert here.count("a wood cup (containing nothing)") == 2


def test_activate_switches_the_named_device_only() -> None:
    room = "Here: a sink, which is turned off. In the sink is: nothing; a stove, which is off"
    here, _ = science_edit(ACTIVATE, room, "an orange", "sink", "")
    assert here == (
        "Here: a sink, which is turned on. In the sink is: nothing; a stove, which is off"
    )


def test_a_reference_to_nothing_listed_changes_nothing() -> None:
    assert science_edit(TAKE, GREENHOUSE, "an orange", "blue light bulb cathode", "") == (
        GREENHOUSE,
        "an orange",
    )
    assert find(GREENHOUSE[6:], "; ", "flower pot 3") is None  # pot 1, 6 and 8 are no match


def test_feedback_names_and_fixed_answers() -> None:
    assert base_name("a baby beaver") == "beaver" and display_name("a baby beaver") == "baby beaver"
    assert display_name("a substance called water") == "water"
    assert display_name("a apple tree in the adult stage, soil") == "apple tree"
    assert science_names(
        ART, "an orange", "pour", "cup containing red paint", "art studio in jug"
    ) == (
        "wood cup",
        "jug",
    )
    assert science_feedback("inventory", "kitchen", GREENHOUSE, "an orange") == (
        "In your inventory, you see: an orange"
    )
    assert science_feedback("put down orange", "hallway", GREENHOUSE, "an orange") == (
        "You move the orange to the hallway."
    )
    assert science_feedback(
        "connect battery anode to orange wire terminal 1", "workshop", "Here: a table", "nothing"
    ) == ("anode on battery is now connected to terminal 1 on orange wire")
    assert look_answer("look at shovel", GREENHOUSE, "an orange")[1] == "a shovel"
    assert look_answer("look in flower pot 8", GREENHOUSE, "an orange")[1] == (
        "Inside the flower pot 8 is: nothing"
    )
    assert look_answer("look in bee hive", GREENHOUSE, "an orange")[1] == (
        "The bee hive isn't open, so you can't see inside."
    )


def _state(here: str, inventory: str, feedback: str = "You look around the greenhouse.") -> str:
    return f"Location: greenhouse\n{here}\nInventory: {inventory}\nFeedback: {feedback}"


INSTRUCTION = (
    "Your task is to find a(n) plant. First, focus on the thing. "
    "Then, move it to the green box in the kitchen."
)


def test_a_fitted_model_learns_the_pick_up_edit_and_predicts_it_in_an_unseen_state() -> None:
    trajectories = []
    for pot in (1, 6, 8):
        taken = science_edit(TAKE, GREENHOUSE, "an orange", f"flower pot {pot}", "")
        step = make_step(
            f"ep-{pot}",
            0,
            _state(GREENHOUSE, "an orange"),
            f"pick up flower pot {pot}",
            _state(*taken, f"You move the flower pot {pot} to the inventory."),
            task_id=f"sw-find-plant-{pot}",
            instruction=INSTRUCTION,
            admissible_actions=[f"pick up flower pot {pot}", "pick up shovel", "look around"],
        )
        trajectories.append(trajectory_of([step]))
    model = GroundedModel(GroundedSettings())
    stats = model.fit(trajectories)
    assert model.science and model.edits[("pick", "")] == TAKE
    assert stats["edit_match"] == 1.0 and stats["edit_match_unchanged"] == 0.0
    task = make_task("sw-find-plant-1", INSTRUCTION, env="scienceworld")
    state = _state(GREENHOUSE, "an orange")
    mem = EpisodeMemory.replay(INSTRUCTION, state)
    out = model.predict(task, mem, state, "pick up shovel", ["pick up shovel", "look around"])
    assert "Inventory: an orange a shovel" in out.next_state
    assert "Feedback: You move the shovel to the inventory." in out.next_state


def test_compass_moves_and_named_doors_get_scienceworld_answers() -> None:
    here = "a table; A door to the kitchen (that is closed)"
    assert science_rule("go", "north", "", "hall", here, "")[1] == (
        "No known action matches that input."
    )
    _, feedback, after = science_rule("open", "kitchen door", "", "hall", here, "")
    assert feedback == "The door is now open." and "kitchen (that is open)" in after


def test_the_same_command_in_the_same_state_replays_what_it_did_nearest_this_step() -> None:
    # ScienceWorld's plants grow as steps pass, and the state's text does not show the time
    kitchen = _state("Here: a table; A door to the greenhouse (that is open)", "an orange")
    seeds = "Here: a flower pot 1 (containing a seed); A door to the kitchen (that is open)"
    grown = "Here: a flower pot 1 (containing a apple tree); A door to the kitchen (that is open)"
    step = partial(make_step, task_id="sw-find-plant-0", instruction=INSTRUCTION)
    arrive = partial(_state, inventory="an orange", feedback="You move to the greenhouse.")
    early = [step("early", 0, kitchen, "go to greenhouse", arrive(seeds))]
    late = [step("late", i, kitchen, "wait1", kitchen) for i in range(6)]
    late += [step("late", 6, kitchen, "go to greenhouse", arrive(grown))]
    model = GroundedModel(GroundedSettings())
    model.fit([trajectory_of(early), trajectory_of(early), trajectory_of(late)])
    task = make_task("sw-find-plant-0", INSTRUCTION, env="scienceworld")
    for n_steps, view in ((0, seeds), (6, grown)):  # seeds is the more often seen
        mem = EpisodeMemory.replay(INSTRUCTION, kitchen)
        mem.n_steps = n_steps
        out = model.predict(task, mem, kitchen, "go to greenhouse", ["go to greenhouse"])
        assert view in out.next_state
