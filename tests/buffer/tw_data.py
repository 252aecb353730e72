"""TextWorld-like transitions for buffer tests: distinct games, episodes, provenance."""

from __future__ import annotations

from components.schema import Provenance, Source, Transition, stable_id
from tests.factories import make_step

# Distinct "games": each has its own rooms, objects and goal, like generated TextWorld games.
GAMES = [
    ("kitchen", "fridge", "red apple", "counter", "Cook a meal with the red apple."),
    ("garden", "shed", "rusty shovel", "flower bed", "Dig up the treasure in the garden."),
    ("library", "bookshelf", "old map", "reading desk", "Find the old map and read it."),
    ("cellar", "wine rack", "brass key", "locked chest", "Unlock the chest in the cellar."),
    ("bathroom", "cabinet", "soap bar", "sink", "Wash your hands with the soap."),
    ("garage", "toolbox", "wrench", "workbench", "Repair the bicycle in the garage."),
]
ACTIONS = ["look", "open {box}", "take {obj} from {box}", "go to {place}", "put {obj} on {place}"]


def tw_state(game: int, step: int) -> str:
    """A short abstract TextWorld-style state of a game at a step."""
    room, box, obj, place, _ = GAMES[game]
    holding = obj if step >= 3 else "nothing"
    opened = "open" if step >= 2 else "closed"
    return (
        f"-= {room.title()} =-\nYou are in the {room}. The {box} is {opened}. "
        f"There is a {place} here.\nInventory: {holding}"
    )


def tw_action(game: int, step: int) -> str:
    """The step's action in a game."""
    _, box, obj, place, _ = GAMES[game]
    return ACTIONS[step % len(ACTIONS)].format(box=box, obj=obj, place=place)


def make_transition(
    game: int,
    episode: str,
    step: int,
    *,
    source: Source = "real",
    iteration: int = 0,
    env: str = "textworld",
    policy: str = "expert",
    note: str = "",
) -> Transition:
    """One valid transition of ``episode`` in ``game`` (``note`` varies the state text)."""
    episode_id = stable_id(env, game, episode, source, iteration)
    return make_step(
        episode_id,
        step,
        tw_state(game, step) + (f"\nA note on the wall reads: {note}" if note else ""),
        tw_action(game, step),
        tw_state(game, step + 1),
        task_id=f"{env}-game-{game}",
        instruction=GAMES[game][4],
        env=env,
        reward=int(step == 4),
        done=step == 4,
        admissible_actions=["look", f"go to {GAMES[game][3]}"],
        source=source,
        provenance=Provenance(
            policy=policy if source == "real" else "agent",
            iteration=iteration,
            checkpoint=None if source == "real" else f"ckpt-{iteration}",
            seed=0,
        ),
    )


def episode(game: int, name: str, steps: int = 5, **kw: object) -> list[Transition]:
    """A whole episode of ``steps`` transitions."""
    return [make_transition(game, name, s, **kw) for s in range(steps)]  # type: ignore[arg-type]
