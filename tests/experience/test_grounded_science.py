"""The grounded model on ScienceWorld-style find tasks: its science features and word prior.

``_episodes`` plays a hand-made find-an-animal game the way ScienceWorld words it: focus
on the animal, then move it to the named box; focusing on the rock loses. Each game has
its own animal; the model is fitted on some games and asked about unseen ones.
"""

from __future__ import annotations

from functools import partial

from components.experience.grounded import GroundedModel, GroundedSettings
from components.experience.grounded_science import (
    SCIENCE_FEATURES,
    WordPrior,
    is_science,
    science_features,
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
