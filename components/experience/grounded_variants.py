"""The curriculum's task generator of the cpu experience model: new goals in a known game.

``TaskVariants`` is a part of ``GroundedModel`` (components/experience/grounded.py). A
variant keeps the seed task's game and asks for something real data showed there: an
earlier step of a multi-step instruction as the goal, or another portable object of the
game as the thing to get; on a web page the same page with another target. DreamGym's
curriculum (components/curriculum) asks for them for the tasks of highest reward variance.
"""

from __future__ import annotations

import random
import re
from collections import Counter
from typing import Any

from components.experience.grounded_page import page_variants
from components.experience.grounded_state import listed_objects, render_state
from components.memory import instruction_steps
from components.schema import Task


class TaskVariants:
    """New instructions in a known game (a part of GroundedModel)."""

    # the GroundedModel fields these methods read
    settings: Any
    pages: bool
    science: bool
    initial: dict[str, tuple[str, tuple[str, ...]]]
    room_views: dict[tuple[str, str], Counter]

    def objects_of(self, task_id: str) -> list[tuple[str, str]]:
        """(object, where) pairs of portable things real data showed in this game."""
        views = [self.initial[task_id][0]] if task_id in self.initial else []
        views += [
            render_state(room, view, "", "")
            for (tid, room), counts in self.room_views.items()
            if tid == task_id
            for view in counts
        ]
        found: dict[str, str] = {}
        for state in views:
            for name, where in listed_objects(state):
                found.setdefault(name, where)
        return sorted(found.items())

    def variants(self, seed: Task, n: int, iteration: int, draw: int | None = None) -> list[str]:
        """Up to ``n`` new instructions in ``seed``'s game: an earlier step of a multi-step
        instruction as the goal, or another object this game holds as the thing to get
        (a page: the same page with another target, ``page_variants``; ScienceWorld: none).
        ``draw``: the run's own seed for this round (each RL seed draws its own)."""
        if self.science:
            # TextWorld's grammar made "Take the nothing; a couch from the chair is." of a
            # ScienceWorld room, and no variant of the dreamt runs was ever won (0 of 1,152)
            return []
        key = f"{self.settings.seed}:{seed.task_id}:{iteration}"
        rng = random.Random(key if draw is None else f"{key}:{draw}")
        game = seed.parent_task_id if seed.generated and seed.parent_task_id else seed.task_id
        if self.pages:  # the same page with another target
            start = self.initial.get(game)
            return page_variants(seed.instruction, start[0], rng, n) if start else []
        steps = instruction_steps(seed.instruction)
        options: list[str] = []
        if len(steps) > 1:
            options += [" ".join(steps[:j]) for j in range(1, len(steps))]
        target = seed.walkthrough[-1] if seed.walkthrough else ""
        for obj, where in self.objects_of(game):
            # a whole word: the keycard the target takes is not the key
            if not re.search(rf"\b{re.escape(obj.lower())}\b", target.lower()):
                verb = rng.choice(("Retrieve", "Recover", "Pick up", "Take"))
                options.append(f"{verb} the {obj} from {where}.")
        rng.shuffle(options)
        return options[:n]
