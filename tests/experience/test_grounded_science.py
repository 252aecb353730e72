"""The grounded model on ScienceWorld-style find tasks: its science features and word prior.

``_episodes`` plays a hand-made find-an-animal game the way ScienceWorld words it: focus
on the animal, then move it to the named box; focusing on the rock loses. Each game has
its own animal; the model is fitted on some games and asked about unseen ones.
"""

from __future__ import annotations

import re
from functools import partial

from components.experience.grounded import GroundedModel, GroundedSettings
from components.experience.grounded_science import (
    SCIENCE_FEATURES,
    WinGate,
    WordPrior,
    circuit_closed,
    focus_as_move,
    is_science,
    mix_refused,
    next_gold,
    science_features,
    science_parse,
    science_rule,
    unlisted_gold,
    win_conditions,
)
from components.memory import EpisodeMemory
from components.schema import Trajectory
from tests.factories import make_step, make_task, trajectory_of

ANIMALS = ("beaver", "mouse", "parrot", "turtle", "rabbit", "wolf", "frog", "owl")
ROCKS = ("granite", "basalt", "marble", "slate", "flint", "quartz", "shale", "chalk")
INSTRUCTION = (
    "Your task is to find a(n) animal. First, focus on the thing. "
    "Then, move it to the red box in the kitchen."
)


def _state(g: int, feedback: str, boxed: bool = False) -> str:
    here = f"a red box (containing {'a baby ' + ANIMALS[g] if boxed else 'nothing'})"
    animal = "" if boxed else f"; a baby {ANIMALS[g]}"
    return (
        f"Location: kitchen\nHere: {here}{animal}; a {ROCKS[g]} rock\n"
        f"Inventory: an orange\nFeedback: {feedback}"
    )


def _episodes(games: range) -> list[Trajectory]:
    out = []
    for g in games:
        tid = f"sw-find-animal-{g}"
        animal, rock = ANIMALS[g], ROCKS[g]
        start = _state(g, "You look around the kitchen.")
        focused = _state(g, f"You focus on the baby {animal}.")

        step = partial(make_step, task_id=tid, instruction=INSTRUCTION)

        win = [
            step(f"{tid}-w", 0, start, f"focus on baby {animal}", focused),
            step(
                f"{tid}-w", 1, focused, f"move baby {animal} to red box",
                _state(g, f"You move the baby {animal} to the red box.", boxed=True),
                reward=1, done=True,
            ),
        ]  # fmt: skip
        lose = [step(f"{tid}-l", 0, start, f"focus on {rock} rock", start, done=True)]
        out += [trajectory_of(win), trajectory_of(lose)]
    return out


def test_is_science_reads_the_task_grammar() -> None:
    assert is_science([INSTRUCTION, "Focus on the green paint."])
    assert not is_science([INSTRUCTION, "Take the key from the table."])
    assert not is_science([])


def test_word_prior_leaves_a_game_out() -> None:
    prior = WordPrior()
    prior.add("g1", INSTRUCTION, "focus on baby beaver", won=False, lost=True)
    prior.add("g2", INSTRUCTION, "focus on baby mouse", won=False, lost=False)
    lost_here = 3  # the loss rate under this kind of task
    assert prior.score(INSTRUCTION, "focus on baby beaver")[lost_here] > 0.3
    left_out = prior.score(INSTRUCTION, "focus on baby beaver", leave_out="g1")
    assert left_out[lost_here] < 0.1  # only g2's "baby" remains, which did not lose


def test_science_features_see_the_focused_object_moved_to_the_box() -> None:
    mem = EpisodeMemory.replay(INSTRUCTION, _state(0, "start"))
    mem.update("focus on baby beaver", _state(0, "You focus on the baby beaver."))
    prior = [0.0] * 4
    move = science_features(mem, _state(0, "x"), "move baby beaver to red box", prior)
    other = science_features(mem, _state(0, "x"), "move granite rock to red box", prior)
    assert len(move) == SCIENCE_FEATURES
    conjunction = 7  # a move of the focused object to the named box
    assert move[conjunction] == 1.0 and other[conjunction] == 0.0
    assert move[2] == 1.0  # something was focused on


def test_fitted_model_judges_unseen_games() -> None:
    model = GroundedModel(GroundedSettings(seed=0))
    model.fit(_episodes(range(6)))
    assert model.science and not model.pages and model.word_prior is not None
    for g in (6, 7):
        task = make_task(f"sw-find-animal-{g}", INSTRUCTION, env="scienceworld")
        start = _state(g, "You look around the kitchen.")
        mem = EpisodeMemory.replay(INSTRUCTION, start)
        rock = model.predict(task, mem, start, f"focus on {ROCKS[g]} rock", [])
        assert rock.lost and not rock.won
        focus = model.predict(task, mem, start, f"focus on baby {ANIMALS[g]}", [])
        assert not focus.won and not focus.lost
        mem.update(f"focus on baby {ANIMALS[g]}", focus.next_state)
        move = model.predict(task, mem, focus.next_state, f"move baby {ANIMALS[g]} to red box", [])
        assert move.won


def test_fitted_model_grants_no_win_without_the_focus() -> None:
    model = GroundedModel(GroundedSettings(seed=0))
    model.fit(_episodes(range(6)))
    assert model.win_gate is not None
    task = make_task("sw-find-animal-7", INSTRUCTION, env="scienceworld")
    start = _state(7, "You look around the kitchen.")
    mem = EpisodeMemory.replay(INSTRUCTION, start)
    # every real win moved a focused thing: the same move with no focus before cannot win
    move = model.predict(task, mem, start, f"move baby {ANIMALS[7]} to red box", [])
    assert not move.won
    # nor in a game real data won: a focus leaves the state as it was, so the recorded
    # winning move of game 0 is found under the same key with or without the focus
    seen = make_task("sw-find-animal-0", INSTRUCTION, env="scienceworld")
    start = _state(0, "You look around the kitchen.")
    mem = EpisodeMemory.replay(INSTRUCTION, start)
    replayed = model.predict(seen, mem, start, f"move baby {ANIMALS[0]} to red box", [])
    assert replayed.evidence == "replay" and not replayed.won
    mem.update(f"focus on baby {ANIMALS[0]}", _state(0, f"You focus on the baby {ANIMALS[0]}."))
    assert model.predict(seen, mem, start, f"move baby {ANIMALS[0]} to red box", []).won


BULB = (
    "Your task is to turn on the red light bulb. First, focus on the red light bulb. "
    "Then, create an electrical circuit that powers it on."
)
WIRES = ("connect battery anode to red wire", "connect battery cathode to blue wire",
         "connect red wire to bulb anode", "connect blue wire to bulb cathode")  # fmt: skip


def _bulb_win(connects: int, last: str) -> tuple[str, str, frozenset[str]]:
    mem = EpisodeMemory.replay(BULB, "Location: workshop\nHere: a battery")
    mem.update("focus on red light bulb", "Location: workshop\nHere: a battery")
    for command in WIRES[:connects]:
        mem.update(command, "Location: workshop\nHere: a battery")
    return BULB, last, win_conditions(mem, "Location: workshop\nHere: a battery", last)


def test_win_gate_needs_what_every_real_win_had() -> None:
    gate = WinGate.fit([_bulb_win(3, WIRES[3]), _bulb_win(4, "wait1"), _bulb_win(3, WIRES[3])])
    assert gate.allows(*_bulb_win(4, "wait1"))
    assert not gate.allows(*_bulb_win(0, "wait1"))  # the dreamt shortcut: wait, no circuit
    assert not gate.allows(*_bulb_win(1, WIRES[1]))
    assert not gate.allows(*_bulb_win(4, "look around"))  # a verb that never won
    # an unseen kind of the same family ("the blue light bulb") takes the red bulb's gate
    blue = BULB.replace("red", "blue")
    assert not gate.allows(blue, "wait1", _bulb_win(0, "wait1")[2])
    assert gate.allows(blue, "wait1", _bulb_win(4, "wait1")[2])
    # a kind sharing nothing is not gated; one with too few wins neither
    assert gate.allows("Focus on the rock.", "wait1", frozenset())
    assert WinGate.fit([_bulb_win(3, WIRES[3])]).allows(*_bulb_win(0, "wait1"))


def test_win_gate_is_per_winning_verb_and_a_move_wins_only_the_focused_thing() -> None:
    plant = "Your task is to find a(n) plant. First, focus on the thing. Then, move it."

    def win(focus: str, command: str) -> tuple[str, str, frozenset[str]]:
        mem = EpisodeMemory.replay(plant, _state(0, "start"))
        if focus:
            mem.update(f"focus on {focus}", _state(0, "x"))
        return plant, command, win_conditions(mem, _state(0, "x"), command)

    pot = "move flower pot 2 containing apple tree in inventory to red box"
    moves = [win("adult apple tree", pot),
             win("blue jay", "move egg blue jay egg in inventory to red box"),
             win("egg frog", "move living thing in inventory to red box")]  # fmt: skip
    gate = WinGate.fit([*moves, win("", "focus on adult pea plant")])
    assert all(gate.allows(*m) for m in moves)
    # the pea plant picked up after focusing on the apple tree: no win, whatever the focus
    # win of the same kind did not need
    assert not gate.allows(*win("adult apple tree", "move adult pea plant in inventory to red box"))


def test_science_parse_drops_the_particle_and_splits_to() -> None:
    assert science_parse("focus on red light bulb") == ("focus", "red light bulb", "", "")
    assert science_parse("pick up baby beaver") == ("pick", "baby beaver", "", "")
    assert science_parse("connect battery anode to red wire terminal 1") == (
        "connect", "battery anode", "to", "red wire terminal 1",
    )  # fmt: skip
    assert science_parse("go to hallway") == ("go", "hallway", "", "")


# real data first saw the hallway with its cellar door shut; no real step left the cellar
HALL = (
    "Location: hallway\nHere: a painting; A door to the cellar (that is closed)\n"
    "Inventory: an orange\nFeedback: You move."
)
CELLAR = (
    "Location: cellar\nHere: a shelf; A door to the hallway (that is open)\n"
    "Inventory: an orange\nFeedback: You look around."
)


def _hallway_walk(game: int, look: bool = False) -> Trajectory:
    """Game ``game`` going to the hallway (then looking at its painting, with ``look``)."""
    tid = f"sw-find-animal-{game}"
    step = partial(make_step, task_id=tid, instruction=INSTRUCTION,
                   admissible_actions=["look at painting", "go to cellar"])  # fmt: skip
    steps = [step(f"{tid}-h", 0, _state(game, "start"), "go to hallway", HALL)]
    if look:
        steps.append(step(f"{tid}-h", 1, HALL, "look at painting", HALL))
    return trajectory_of(steps)


def test_go_to_a_room_of_the_game_goes_there_through_open_doors() -> None:
    model = GroundedModel(GroundedSettings(seed=0))
    model.fit([*_episodes(range(6)), _hallway_walk(0)])
    task = make_task("sw-find-animal-0", INSTRUCTION, env="scienceworld")
    mem = EpisodeMemory.replay(INSTRUCTION, CELLAR)
    # no real step went from the cellar, but the command names a room this game has
    out = model.predict(task, mem, CELLAR, "go to hallway", ["go to hallway"])
    assert out.next_state.startswith("Location: hallway") and out.evidence == "map"
    # the door just walked through is open on the hallway's side too
    assert "door to the cellar (that is open)" in out.next_state
    # the cellar is a room of this episode (real data never showed it): going back works
    rooms = {"cellar": "a shelf; A door to the hallway (that is open)"}
    back = model.predict(task, mem, out.next_state, "go to cellar", ["go to cellar"], rooms)
    assert back.next_state.startswith("Location: cellar") and "shelf" in back.next_state
    # as in ScienceWorld: not through a closed door, nor where no door leads
    shut = CELLAR.replace("(that is open)", "(that is closed)")
    out = model.predict(task, mem, shut, "go to hallway", ["go to hallway"])
    assert out.next_state.startswith("Location: cellar") and "not open" in out.next_state
    out = model.predict(task, mem, CELLAR, "go to kitchen", ["go to kitchen"])
    assert out.next_state.startswith("Location: cellar") and "not clear" in out.next_state


def test_a_focus_on_the_thing_already_in_the_box_wins_as_scienceworld_judges_it() -> None:
    # real data only ever focused first; ScienceWorld also wins a move first, then a focus
    model = GroundedModel(GroundedSettings(seed=0))
    model.fit(_episodes(range(6)))
    task = make_task("sw-find-animal-6", INSTRUCTION, env="scienceworld")
    boxed = _state(6, "You move the baby frog to the red box.", boxed=True)
    mem = EpisodeMemory.replay(INSTRUCTION, _state(6, "start"))
    mem.update("move baby frog to red box", boxed)
    after, move = focus_as_move(mem, boxed, "focus on baby frog")
    assert move == "move baby frog to red box" and after.used["focus on baby frog"] == 1
    out = model.predict(task, mem, boxed, "focus on baby frog", ["focus on baby frog"])
    assert out.reward == 1 and out.won
    # not a thing outside the box, nor a focus before anything was moved
    assert focus_as_move(mem, boxed, "focus on flint rock") is None
    drawer = boxed.replace("a baby frog", "a drawer")
    assert focus_as_move(mem, drawer, "focus on drawer")[1] == "move drawer to red box"
    start = _state(6, "start")
    assert (
        focus_as_move(EpisodeMemory.replay(INSTRUCTION, start), start, "focus on baby frog") is None
    )


def test_a_remembered_non_ending_is_judged_anew_for_this_episode() -> None:
    # the state's text does not show what was focused on: a dreamt "nothing happens" for
    # this focus in this state (after another history) must not hide this episode's win
    model = GroundedModel(GroundedSettings(seed=0))
    model.fit(_episodes(range(6)))
    task = make_task("sw-find-animal-6", INSTRUCTION, env="scienceworld")
    boxed = _state(6, "You move the baby frog to the red box.", boxed=True)
    focused = _state(6, "You focus on the baby frog.", boxed=True)
    other = make_step("dreamt", 0, boxed, "focus on baby frog", focused, task_id=task.task_id,
                      instruction=INSTRUCTION, env="scienceworld")  # fmt: skip
    assert model.add_synthetic([trajectory_of([other], truncated=True)]) == 1
    mem = EpisodeMemory.replay(INSTRUCTION, _state(6, "start"))
    mem.update("move baby frog to red box", boxed)
    out = model.predict(task, mem, boxed, "focus on baby frog", ["focus on baby frog"])
    assert out.won and out.evidence == "synthetic_replay" and out.next_state == focused


BULB = (
    "Your task is to turn on the red light bulb. First, focus on the red light bulb. "
    "Then, create an electrical circuit that powers it on."
)
CIRCUIT = (
    "connect battery anode to black wire terminal 1",
    "connect battery cathode to orange wire terminal 1",
    "connect black wire terminal 2 to cathode in red light bulb",
    "connect orange wire terminal 2 to anode in red light bulb",
)


def _circuit(*commands: str) -> EpisodeMemory:
    mem = EpisodeMemory.replay(BULB, "Location: workshop\nHere: a battery\nInventory: \nFeedback: ")
    for c in commands:
        mem.update(c, "Location: workshop\nHere: a battery\nInventory: \nFeedback: ok")
    return mem


def test_a_circuit_closes_through_the_focused_bulb_only() -> None:
    assert circuit_closed(_circuit("focus on red light bulb", *CIRCUIT))
    assert circuit_closed(_circuit("focus on red light bulb", *reversed(CIRCUIT)))
    assert not circuit_closed(_circuit("focus on red light bulb", *CIRCUIT[:3]))
    assert not circuit_closed(_circuit(*CIRCUIT))  # nothing focused on
    # the focus moved elsewhere; a wire picked up; the bulb's poles the other way round
    assert not circuit_closed(_circuit("focus on red light bulb", "focus on orange", *CIRCUIT))
    assert not circuit_closed(_circuit("focus on red light bulb", *CIRCUIT, "pick up black wire"))
    swap = {"cathode in": "anode in", "anode in": "cathode in"}
    swapped = [re.sub("(cathode|anode) in", lambda m: swap[m.group(0)], c) for c in CIRCUIT]
    assert not circuit_closed(_circuit("focus on red light bulb", *swapped))
    # the other bulb on the table is not the task's
    other = [c.replace("red light bulb", "green light bulb") for c in CIRCUIT]
    assert not circuit_closed(_circuit("focus on red light bulb", *other))


def test_the_step_after_the_circuit_closes_wins_whatever_it_is() -> None:
    # ScienceWorld lights the bulb on the next tick: real wins came at a wait1, a door
    model = GroundedModel(GroundedSettings(seed=0))
    model.fit(_episodes(range(6)))
    task = make_task("sw-power-component-0", BULB, env="scienceworld")
    state = "Location: workshop\nHere: a battery\nInventory: \nFeedback: ok"
    closed = _circuit("focus on red light bulb", *CIRCUIT)
    assert model.predict(task, closed, state, "wait1", ["wait1"]).won
    assert model.predict(task, closed, state, "open door to hallway", []).won
    assert not model.predict(task, closed, state, "focus on battery", []).won
    open_ = _circuit("focus on red light bulb", *CIRCUIT[:3])
    assert not model.predict(task, open_, state, "wait1", ["wait1"]).won


def test_a_room_this_game_never_showed_is_borrowed_from_its_task_family() -> None:
    # only game 1's data entered the hallway; every ScienceWorld game shares one house
    model = GroundedModel(GroundedSettings(seed=0))
    model.fit([*_episodes(range(6)), _hallway_walk(1, look=True)])
    task = make_task("sw-find-animal-0", INSTRUCTION, env="scienceworld")
    mem = EpisodeMemory.replay(INSTRUCTION, CELLAR)
    out = model.predict(task, mem, CELLAR, "go to hallway", ["go to hallway"])
    # game 0 goes there (not "You can't go that way") and sees game 1's hallway
    assert out.next_state.startswith("Location: hallway") and "painting" in out.next_state
    assert out.evidence == "map" and "look at painting" in out.admissible
    assert "door to the cellar (that is open)" in out.next_state
    # a room no game of the data showed stays unknown
    out = model.predict(
        task, mem, CELLAR.replace("hallway", "attic"), "go to attic", ["go to attic"]
    )
    assert out.next_state.startswith("Location: cellar")


def test_a_composed_command_list_holds_the_expert_next_command_only() -> None:
    # the real env lists the expert's next command among the others (its pointer moves when
    # that command is played); a dreamt list gets the same, never a later one before it
    look = [
        make_step("sw-find-animal-0-look", 0, _state(0, "start"), "look around",
                  _state(0, "You look around."), task_id="sw-find-animal-0",
                  instruction=INSTRUCTION, admissible_actions=["look at granite rock", "wait1"],
                  policy="random"),
    ]  # fmt: skip
    model = GroundedModel(GroundedSettings(seed=0))
    model.fit([*_episodes(range(6)), trajectory_of(look)])
    gold = ("focus on baby beaver", "move baby beaver to red box")
    assert model.gold_path["sw-find-animal-0"] == gold
    unseen = _state(0, "x").replace("; a granite rock", "; a granite rock; a chair")
    adm, fallback = model._admissible("sw-find-animal-0", unseen, [], ["look around"])
    assert fallback and {"focus on baby beaver", "look at granite rock", "wait1"} <= set(adm)
    assert "move baby beaver to red box" not in adm  # not before the focus
    adm, _ = model._admissible("sw-find-animal-0", unseen, [], ["focus on baby beaver"])
    assert "move baby beaver to red box" in adm
    assert next_gold(gold, ["focus on baby beaver", "move baby beaver to red box"]) is None
    assert next_gold(("go to hall", "go to hall"), ["go to hall"]) == "go to hall"
    # the pointer moves only past the command that is next: a move played before the
    # focus does not count, so after both the move is still to come (then never listed)
    assert next_gold(gold, ["move baby beaver to red box", "focus on baby beaver"]) == gold[1]


def test_a_recorded_full_list_loses_its_episodes_next_gold_command() -> None:
    # the env lists the expert's next command first, ahead of what its cap cuts: a recorded
    # list that is full holds it only because of that episode's pointer
    full = (*(f"look at thing {i}" for i in range(39)), "move baby beaver to red box")
    assert "move baby beaver to red box" not in unlisted_gold(
        full, "move baby beaver to red box", 40
    )
    assert unlisted_gold(full[1:], "move baby beaver to red box", 40) == full[1:]  # not full
    assert unlisted_gold(full, None, 40) == full


def test_mix_needs_two_things_in_the_container() -> None:
    # real data's mixes nearly all worked: the learned feedback mixed an empty bowl too
    here = (
        "a table. On the table is: a bowl (containing nothing); a wood cup (containing blue paint)"
    )
    assert mix_refused(here, "bowl") == "That container is empty, so there are no items to mix."
    assert mix_refused(here, "wood cup") == "There is only one thing (blue paint)"
    full = here.replace("bowl (containing nothing)", "bowl (containing blue paint, yellow paint)")
    assert mix_refused(full, "bowl") is None
    assert mix_refused(here, "jug") is None  # not in view: left to the model


def test_opening_a_door_opens_it_in_the_state() -> None:
    here = "a table; A door to the kitchen (that is closed)"
    _, feedback, after = science_rule("open", "door", "kitchen", "hall", here, "")
    assert feedback == "The door is now open." and "kitchen (that is open)" in after
    assert (
        science_rule("open", "door", "kitchen", "hall", after, "")[1] == "The door is already open."
    )
    assert science_rule("close", "door", "kitchen", "hall", after, "")[2] == here
    assert science_rule("go", "kitchen", "", "hall", after, "") is None  # open: the model moves
    # no such door here: ScienceWorld knows no such action (the dream opened it anyway)
    nothing = science_rule("open", "door", "hallway", "hall", here, "")
    assert nothing[1] == "No known action matches that input." and nothing[2] == here
    assert science_rule("look", "around", "", "hall", here, "")[1] == "You look around the hall."
