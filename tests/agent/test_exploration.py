"""S2R exploration: the map of recorded walks, and walks to its unknown exits."""

from __future__ import annotations

from components.envs.base import ADMISSIBLE
from tests.factories import make_step, trajectory_of


def _room(name: str, exits: str) -> str:
    return f"Location: {name}\nExits: {exits}.\nInventory: nothing\nFeedback: You are in {name}."


HALL, KITCHEN = _room("Hall", "east, north"), _room("Kitchen", "west, south")
DEN = _room("Den", "south")


def _walk(*steps: tuple[str, str, str]):
    return trajectory_of([make_step("ep", i, *s) for i, s in enumerate(steps)])


def test_the_map_knows_only_the_exits_an_episode_went_through() -> None:
    from components.stages.exploration import known_maps

    maps = known_maps([_walk((HALL, "go east", KITCHEN), (KITCHEN, "take apple", KITCHEN))])
    room_map = maps["tw-quest-0"]
    assert room_map.leads == {("Hall", "east"): "Kitchen"}
    # unknown: the Hall's north and the Kitchen's exits, but not the way back it came
    assert room_map.frontier() == [("Hall", "north"), ("Kitchen", "south"), ("Kitchen", "west")]


def test_the_walk_goes_through_known_exits_to_the_nearest_unknown_one() -> None:
    from components.stages.exploration import RoomMap

    room_map = RoomMap()
    room_map.walked(HALL, "go east", KITCHEN)
    room_map.walked(KITCHEN, "go west", HALL)
    room_map.walked(HALL, "go north", DEN)
    room_map.walked(DEN, "go south", HALL)
    assert room_map.next_move("Den") == "go south"  # the Den is done: back to the Hall...
    room_map.walked(HALL, "go east", KITCHEN)
    assert room_map.next_move("Kitchen") == "go south"  # ...then the nearest unknown exit
    room_map.walked(KITCHEN, "go south", KITCHEN)  # a wall: "You can't go that way"
    assert room_map.leads[("Kitchen", "south")] == "Kitchen" and room_map.frontier() == []
    assert room_map.next_move("Kitchen") is None  # nothing left: the walk ends


def test_an_unknown_exit_behind_an_unwalked_room_is_not_reachable() -> None:
    from components.stages.exploration import RoomMap

    room_map = RoomMap()
    room_map.see(DEN)  # seen (in another episode) but never connected to the Hall
    room_map.walked(HALL, "go east", KITCHEN)
    room_map.walked(KITCHEN, "go west", HALL)
    room_map.walked(HALL, "go north", HALL)
    room_map.walked(KITCHEN, "go south", KITCHEN)
    assert room_map.frontier() == [("Den", "south")]
    assert room_map.next_move("Hall") is None


class Corridor:
    """Rooms 0, 1, 2, ... east of each other; the episode is truncated after ``max_steps``."""

    name = "textworld"

    def __init__(self, max_steps: int) -> None:
        self.max_steps, self.room, self.n, self.steps = max_steps, 0, 0, 0

    def _state(self, feedback: str) -> str:
        exits = "east" if self.room == 0 else "east, west"
        where = f"Location: Room {self.room}\nExits: {exits}."
        return f"{where}\nInventory: nothing\nFeedback: {feedback}"

    def reset(self, task, seed=None):
        self.room, self.n = 0, 0
        return self._state("Hello."), {ADMISSIBLE: ["go east"]}

    def step(self, action: str):
        self.n, self.steps = self.n + 1, self.steps + 1
        self.room += {"go east": 1, "go west": -1}.get(action, 0)
        return self._state("Moved."), 0, False, self.n >= self.max_steps, {}

    def close(self) -> None:
        pass


def test_a_walk_the_step_limit_cuts_is_truncated_not_lost(tmp_path) -> None:
    from components.experience.grounded_outcome import episode_rows
    from components.stages.exploration import RoomMap, explore_rollouts
    from tests.factories import make_task

    envs: list[Corridor] = []

    def factory() -> Corridor:
        envs.append(Corridor(max_steps=3))
        return envs[-1]

    room_map = RoomMap()
    room_map.see(Corridor(3)._state("Hello."))
    tasks = [make_task("tw-c-0"), make_task("tw-c-1")]
    maps = {"tw-c-0": room_map, "tw-c-1": RoomMap()}  # tw-c-1: nothing recorded, not walked
    kw = {"cap": 5, "max_steps": 10, "seed": 0, "out_dir": tmp_path}
    walks, steps = explore_rollouts(maps, factory, tasks, **kw)
    assert steps == 3 == envs[0].steps and [w.task_id for w in walks] == ["tw-c-0"]
    assert [s.action for s in walks[0].steps] == ["go east"] * 3  # always the nearest unknown
    assert walks[0].truncated and walks[0].steps[-1].done and not walks[0].success
    assert not any(lost for _, _, lost in episode_rows(walks))  # a cut walk teaches no loss
    assert maps["tw-c-0"].leads == {}  # the caller's map is left as it was
