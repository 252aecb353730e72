"""Sim-to-real exploration: real steps spent where the dream's map is blank.

The grounded experience model knows a game's map only as far as recorded episodes walked
it: an exit no episode took answers "You can't go that way" in the dream (or leads to a
guessed room), so DreamGym learns that unexplored exits are walls, and the rooms behind
them (where a treasure hunt's object often is) never appear. ``explore_rollouts`` walks
each train game's map in the real env, through the exits the model knows to the nearest
one it does not, and records what is there; the re-grounded model is fit on those walks
too (components/stages/regrounding.py). Only compass exits are explored (TextWorld);
an env without them has no frontier and spends nothing.
"""

from __future__ import annotations

import copy
import json
import logging
import random
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.io import read_json
from components.schema import Task, Trajectory, read_jsonl, stable_id, write_jsonl

log = logging.getLogger("dreamgym")

EXPLORE_POLICY = "s2r-explore"  # the walks' Trajectory.policy
__all__ = ["EXPLORE_POLICY", "RoomMap", "explore_rollouts", "known_maps"]


@dataclass
class RoomMap:
    """A game's rooms, their compass exits and where the walked ones lead."""

    exits: dict[str, set[str]] = field(default_factory=dict)  # room -> its exits
    leads: dict[tuple[str, str], str] = field(default_factory=dict)  # (room, exit) -> room

    def see(self, state: str) -> str:
        """Record the room ``state`` shows and its exits; returns the room."""
        from components.experience.grounded_state import exits_of, split_cached

        room, surroundings, _ = split_cached(state)
        self.exits.setdefault(room, set()).update(exits_of(surroundings))
        return room

    def walked(self, state: str, action: str, next_state: str) -> None:
        """Record a step: a ``go <exit>`` leads where ``next_state`` is (itself: a wall)."""
        room, there = self.see(state), self.see(next_state)
        verb, _, direction = action.strip().lower().partition(" ")
        if verb == "go" and direction in self.exits.get(room, ()):
            self.leads[(room, direction)] = there

    def frontier(self) -> list[tuple[str, str]]:
        """(room, exit) pairs whose destination is unknown, sorted."""
        return sorted(
            (r, d) for r, ds in self.exits.items() for d in ds if (r, d) not in self.leads
        )

    def next_move(self, room: str) -> str | None:
        """``go <exit>`` toward the nearest unknown exit (breadth-first), None if none."""
        known = self.leads
        todo = {r: sorted(d for d in ds if (r, d) not in known) for r, ds in self.exits.items()}
        first: dict[str, str | None] = {room: None}
        queue = deque([room])
        while queue:
            here = queue.popleft()
            if todo.get(here):
                return first[here] or f"go {todo[here][0]}"
            for d in sorted(self.exits.get(here, ())):
                there = self.leads.get((here, d))
                if there is not None and there not in first:
                    first[there] = first[here] or f"go {d}"
                    queue.append(there)
        return None


def known_maps(trajectories: Iterable[Trajectory]) -> dict[str, RoomMap]:
    """Each game's map as ``trajectories`` (the re-grounded model's data) walked it."""
    maps: dict[str, RoomMap] = {}
    for traj in trajectories:
        room_map = maps.setdefault(traj.task_id, RoomMap())
        for step in traj.steps:
            room_map.walked(step.state, step.action, step.next_state)
    return maps


def explore_rollouts(
    maps: dict[str, RoomMap],
    env_factory: Callable[[], Any],
    tasks: Sequence[Task],
    *,
    cap: int,
    max_steps: int,
    seed: int,
    out_dir: Path,
) -> tuple[list[Trajectory], int]:
    """(real walks, real steps): one walk per train game with unknown exits, most first.

    A walk goes, step by step, toward the nearest exit of unknown destination until none
    is left, ``max_steps`` are taken or the ``cap`` is spent (a walk never starts a step
    past it). Saved in ``out_dir``, so a resumed run reuses them instead of spending real
    steps again.
    """
    from components.agent.policy import Decision, Observation
    from components.agent.policy_base import ActResult
    from components.agent.rollout import Episode, Turn
    from components.envs.base import ADMISSIBLE, VALID, step_won
    from components.envs.vector import ENV_ERROR, EnvList

    order = [t for t in tasks if maps.get(t.task_id) and maps[t.task_id].frontier()]
    random.Random(seed).shuffle(order)  # ties: a seeded order
    order.sort(key=lambda t: -len(maps[t.task_id].frontier()))
    # the maps decide every walk: probes of another policy (a rerun after a kill) draw
    # other maps, and their walks must not be reused
    drawn = [
        (t.task_id, sorted(maps[t.task_id].leads.items()), maps[t.task_id].frontier())
        for t in order
    ]
    key = stable_id(cap, max_steps, seed, *drawn, n=10)
    saved = out_dir / f"walks-{key}.jsonl"
    done = saved.with_suffix(".json")
    if done.exists():
        return list(read_jsonl(saved, Trajectory)), int(read_json(done)["steps"])
    env = EnvList(factory=env_factory)
    walks: list[Trajectory] = []
    try:
        for index, task in enumerate(order):
            if env.real_steps >= cap:
                break
            room_map = copy.deepcopy(maps[task.task_id])  # the caller's maps stay as given
            ((state, info),) = env.reset([task])
            if ENV_ERROR in info:
                continue
            ep = Episode(task=task, group=index, initial_state=state)
            listed = tuple(info.get(ADMISSIBLE) or ()) or None
            obs = Observation(task.instruction, state, admissible=listed, initial_state=state)
            while len(ep.turns) < max_steps and env.real_steps < cap:
                action = room_map.next_move(room_map.see(state))
                if action is None:
                    break
                out = env.step([action])[0]
                if out is None:
                    break
                nxt, reward, terminated, truncated, info = out
                if ENV_ERROR in info:
                    break
                room_map.walked(state, action, nxt)
                act = ActResult(action, action, Decision(action, None), None, (), (), ())
                ended = bool(terminated or truncated)
                won = step_won(info, float(reward))
                valid = bool(info.get(VALID, True))
                ep.turns.append(Turn(obs, act, float(reward), nxt, valid, ended, won))
                obs = obs.then(action, nxt, info.get(ADMISSIBLE))
                state = nxt
                if ended:  # a walk the step limit cut is truncated, never a loss
                    ep.terminated, ep.won = bool(terminated), won
                    ep.truncated = bool(truncated and not terminated)
                    break
            traj = ep.to_trajectory(source="real", policy=EXPLORE_POLICY, index=index)
            if traj is not None:
                walks.append(traj)
    finally:
        env.close()
    write_jsonl(saved, walks)
    done.write_text(json.dumps({"steps": env.real_steps, "walks": len(walks)}))
    log.info(
        "S2R seed %d: %d real walks to unknown exits, %d real steps (%d games had some)",
        seed,
        len(walks),
        env.real_steps,
        len(order),
    )
    return walks, env.real_steps
