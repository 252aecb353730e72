"""TextWorld behind the Env / ReplayableEnv interface (Gymnasium 5-tuple semantics).

The observation is a compact abstract state, never the transcript::

    Location: Office
    Exits: north. The desk is open and contains a key. On the floor: a mop.
    Inventory: a teaspoon
    Feedback: <the game's answer to the last action>

The middle line is rendered from the game's facts (textworld_state.py): only what is
visible from the room, without the flavour text of TextWorld's descriptions
(``state_format="description"`` keeps the game's own description instead).

Rewards are outcome-only by default (``reward="won"``): 1 on the step that wins the game,
else 0. ``reward="score"`` returns the step's gain of the game's own score normalised by its
max score instead (a dense game pays its partial credit); the info logs both (``won``,
``norm_score``). A game without a goal plays until ``max_steps``. An episode is
``terminated`` when the game is won or lost and ``truncated`` after ``max_steps`` steps.
Game meta-commands (quit, restart, save, undo...: ``episodic.META_VERBS``) and chained
commands never reach the engine: the step is refused as invalid and the state stays as it was.
TextWorld games are deterministic, so ``replay`` (reset, re-apply a prefix, apply one
action) returns exactly what live stepping returned.
"""

from __future__ import annotations

import contextlib
import re
from collections import OrderedDict
from pathlib import Path
from typing import Any

from components.config.data import RewardMode
from components.envs.base import REWARD_WON, EnvError, normalised_score
from components.envs.episodic import EpisodicEnv, Step, collapse, normalize_command
from components.envs.textworld_state import compact_description, compact_inventory
from components.schema import Task

ENV_NAME = "textworld"

_HEADER = re.compile(r"-=\s*(.*?)\s*=-")
_PROMPT_LINE = re.compile(r"\n>[^\n]*$")  # the input prompt + status bar ending each output
_RESTART = re.compile(r"Would you like to RESTART, RESTORE a saved game, QUIT or UNDO[^\n]*")
_ART_LINE = re.compile(r"^[\s_|\\/$<>]+$")
_CARRYING = re.compile(r"^You are carrying:?\s*(.*?)\.?$", re.IGNORECASE)
_CHAINED = re.compile(r"[.;,]|\bthen\b", re.IGNORECASE)  # Inform7 command separators
CHAINED_FEEDBACK = "One command at a time, please."
STATE_FORMATS = ("compact", "description")


def clean_feedback(raw: str, objective: str | None = None) -> str:
    """The game's answer without the ASCII-art banner, prompt/status line and restart menu."""
    text = _PROMPT_LINE.sub("", raw or "")
    text = _RESTART.sub("", text)
    lines = [ln for ln in text.splitlines() if not ("$$" in ln or _ART_LINE.match(ln))]
    text = collapse("\n".join(lines))
    if objective:
        text = text.replace(collapse(objective), " ")
    return collapse(text)


def split_description(raw: str | None) -> tuple[str, str]:
    """(location name, description without the ``-= Room =-`` header)."""
    text = raw or ""
    match = _HEADER.search(text)
    if not match:
        return "unknown", collapse(text)
    return match.group(1), collapse(text[: match.start()] + " " + text[match.end() :])


def clean_inventory(raw: str | None) -> str:
    """``You are carrying: a mop.`` -> ``a mop``; ``You are carrying nothing.`` -> ``nothing``."""
    text = collapse(raw or "")
    match = _CARRYING.match(text)
    return (match.group(1) or "nothing") if match else text


def render_state(location: str, description: str, inventory: str, feedback: str) -> str:
    """The abstract state text shown to agents and the experience model."""
    return f"Location: {location}\n{description}\nInventory: {inventory}\nFeedback: {feedback}"


def story_file_problem(path: Path) -> str | None:
    """Why a Z-machine game file would kill the process loading it (None if it looks whole)."""
    # Frotz (inside jericho, in-process) calls exit(1) on a truncated or garbled story
    # file: no exception to catch, the process hosting the engine just dies. The header
    # declares the version, the length and a checksum, so such files are caught here.
    try:
        data = path.read_bytes()
    except OSError as err:
        return f"cannot read {path}: {err.strerror}"
    if len(data) < 64:
        return f"{path}: {len(data)} bytes, shorter than a Z-machine header"
    version = data[0]
    if not 1 <= version <= 8:
        return f"{path}: not a Z-machine story file (version byte {version})"
    scale = 2 if version <= 3 else 4 if version <= 5 else 8
    length = int.from_bytes(data[0x1A:0x1C], "big") * scale
    if length and length > len(data):
        return f"{path}: truncated ({len(data)} of {length} bytes)"
    checksum = int.from_bytes(data[0x1C:0x1E], "big")
    if length and checksum and _byte_sum(data, 0x40, length) % 0x10000 != checksum:
        return f"{path}: corrupted (checksum mismatch)"
    return None


def _byte_sum(data: bytes, start: int, end: int) -> int:
    """Sum of ``data[start:end]`` (numpy: ~14x faster than ``sum()`` on a 400 KB story)."""
    import numpy as np

    return int(np.frombuffer(data, dtype=np.uint8)[start:end].sum(dtype=np.uint64))


class EnginePool:
    """Loaded TextWorld games shared by the envs of one factory, kept for reuse.

    Starting a game (parsing its .json knowledge base, loading the story file) costs ~3x
    a reset; RL rounds and evaluation restart the same games again and again, on whichever
    env slot is free. An env gives its engine back here when it switches games or closes,
    and takes an idle one of its next game if there is one. At most ``max_idle`` idle
    engines (~2.4 MB each) are kept; the least recently returned are closed first. The
    default holds a GRPO round's engines (4 per game) for all 160 train games of the cpu
    profile: with 256, ~70% of the restarts in a real GRPO run reloaded their game.
    """

    def __init__(self, max_idle: int = 1024) -> None:
        self.max_idle = max_idle
        self._idle: OrderedDict[tuple[str, bool, str], list[Any]] = OrderedDict()
        self._n_idle = 0
        self.hits = self.misses = 0

    def take(self, key: tuple[str, bool, str]) -> Any | None:
        """An idle engine of ``key`` (game path, expert, state format), or None."""
        engines = self._idle.get(key)
        if not engines:
            self.misses += 1
            return None
        self.hits += 1
        self._n_idle -= 1
        tw = engines.pop()
        if not engines:
            del self._idle[key]
        return tw

    def give(self, key: tuple[str, bool, str], tw: Any) -> None:
        """Keep ``tw`` for reuse (closing the oldest idle engines beyond ``max_idle``)."""
        self._idle.setdefault(key, []).append(tw)
        self._idle.move_to_end(key)
        self._n_idle += 1
        while self._n_idle > self.max_idle:
            oldest = next(iter(self._idle))
            _close(self._idle[oldest].pop(0))
            self._n_idle -= 1
            if not self._idle[oldest]:
                del self._idle[oldest]

    def close(self) -> None:
        """Close every idle engine."""
        for engines in self._idle.values():
            for tw in engines:
                _close(tw)
        self._idle.clear()
        self._n_idle = 0


def _close(tw: Any) -> None:
    with contextlib.suppress(Exception):  # a dead engine may fail to close
        tw.close()


class TextWorldEnv(EpisodicEnv):
    """A TextWorld game as a 5-tuple env with admissible actions, an expert and replay."""

    name = ENV_NAME

    def __init__(
        self,
        max_steps: int,
        root: Path | None = None,
        state_format: str = "compact",
        *,
        expert: bool = True,
        engines: EnginePool | None = None,
        reward: RewardMode = REWARD_WON,
    ) -> None:
        super().__init__(max_steps, reward)
        if state_format not in STATE_FORMATS:
            raise ValueError(f"state_format must be one of {STATE_FORMATS}")
        self.state_format = state_format
        self.root = Path(root) if root is not None else None
        # TextWorld replans its winning policy after every command when asked for it; only
        # collection needs that plan (expert_action), and without it a step is ~2x cheaper
        self.expert = expert
        self._location = "unknown"
        self._tw: Any = None  # the textworld environment, reused while the game is the same
        self._engines = engines  # shared with the other envs of a factory (None: not shared)
        self._game_path: str | None = None
        self._state: Any = None

    # -- paths and the engine ------------------------------------------------------------

    def resolve_game_file(self, task: Task) -> Path:
        """The game file of ``task``, resolving a relative path against ``root`` (or cwd)."""
        if not task.game_file:
            raise EnvError(f"task {task.task_id} has no game_file")
        path = Path(task.game_file)
        if not path.is_absolute():
            path = (self.root or Path.cwd()) / path
        return path

    def _engine(self, path: Path) -> Any:
        if self._tw is not None and self._game_path == str(path):
            return self._tw
        self._release()
        key = (str(path), self.expert, self.state_format)
        reused = self._engines.take(key) if self._engines is not None else None
        if reused is not None:
            self._tw, self._game_path = reused, str(path)
            return reused
        import textworld  # heavy import kept to this module

        if not path.is_file() or not path.with_suffix(".json").is_file():
            raise EnvError(f"game file {path} (and its .json) not found")
        problem = story_file_problem(path) if path.suffix.startswith(".z") else None
        if problem is not None:  # loading it would exit() this very process
            raise EnvError(f"cannot start {path}: {problem}")
        compact = self.state_format == "compact"
        # The compact state is rendered from the facts and the room name read off the
        # feedback's "-= Room =-" header: asking TextWorld for the description and the
        # inventory too would make it send "look" and "inventory" after every command.
        infos = textworld.EnvInfos(
            feedback=True,
            description=not compact,
            inventory=not compact,
            admissible_commands=True,
            policy_commands=self.expert,
            won=True,
            lost=True,
            objective=True,
            facts=compact,
        )
        try:
            self._tw = textworld.start(str(path), request_infos=infos)
        except Exception as err:
            raise EnvError(f"cannot start {path}: {err}") from err
        # Jericho would re-run "look" and "inventory" after every command for games it
        # "fully supports"; TextWorld's Inform7 wrapper already reads both from the game's
        # own output, so this only triples the cost of a step.
        frotz = getattr(getattr(self._tw, "unwrapped", None), "_jericho", None)
        if frotz is not None and hasattr(frotz, "is_fully_supported"):
            frotz.is_fully_supported = False
        self._game_path = str(path)
        return self._tw

    def _release(self) -> None:
        """Give a healthy engine back to the shared pool (or close it when not shared)."""
        if self._tw is not None and self._engines is not None and self._game_path is not None:
            tw, path, self._tw, self._game_path = self._tw, self._game_path, None, None
            self._done = True
            self._engines.give((path, self.expert, self.state_format), tw)
        else:
            self._discard()

    def _discard(self) -> None:
        """Drop the engine (after an error, or to switch games); the next reset restarts it."""
        tw, self._tw, self._game_path = self._tw, None, None
        self._done = True
        if tw is not None:
            with contextlib.suppress(Exception):  # a dead engine may fail to close
                tw.close()

    # -- Env -------------------------------------------------------------------------------

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start ``task``'s game; ``seed`` is ignored (TextWorld games are deterministic)."""
        del seed
        path = self.resolve_game_file(task)
        tw = self._engine(path)
        try:
            state = tw.reset()
        except Exception as err:
            self._discard()
            raise EnvError(f"reset failed for {task.task_id}: {err}") from err
        self._task = task
        self._history = []
        self._state = state
        self._done = False
        self._location = "unknown"  # until the first "-= Room =-" header
        self._norm_score = normalised_score(state.get("score"), state.get("max_score"))
        self._admissible = sorted(state.get("admissible_commands") or [])
        objective = state.get("objective") or task.instruction
        feedback = clean_feedback(state.get("feedback", ""), objective)
        obs, location = self._observe(state, feedback)
        info = self._info(state, feedback, location, valid=True)
        return obs, info

    def _advance(self, action: str, limit: int | None) -> Step:
        task = self._require_running()
        # control characters can crash the Z-machine interpreter (segfault on "go\x13")
        command = collapse("".join(ch if ch.isprintable() else " " for ch in action))
        valid = normalize_command(command) in {normalize_command(a) for a in self._admissible}
        refusal = self._meta_refusal(command)
        if refusal is not None:
            # quit/restart would lock the game in a yes/no prompt or desync the tracked
            # state, save/script write files: refused, the state stays as it was
            state = {**self._state, "feedback": refusal}
        elif not valid and _CHAINED.search(command):
            # Inform7 would run "go east. take key" as two commands in one step; refuse it
            # so one step is always one action (the state stays as it was).
            state = {**self._state, "feedback": CHAINED_FEEDBACK}
        else:
            try:
                state, _, _ = self._tw.step(command)
            except Exception as err:
                self._discard()
                raise EnvError(f"step {command!r} failed on {task.task_id}: {err}") from err
        self._history.append(command)
        self._state = state
        won, lost = bool(state.get("won")), bool(state.get("lost"))
        terminated = won or lost
        truncated = not terminated and limit is not None and len(self._history) >= limit
        self._done = terminated or truncated
        self._admissible = [] if terminated else sorted(state.get("admissible_commands") or [])
        feedback = clean_feedback(state.get("feedback", ""))
        obs, location = self._observe(state, feedback)
        reward = self._scored(won, normalised_score(state.get("score"), state.get("max_score")))
        info = self._info(state, feedback, location, valid=valid)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """Release the game engine (back to the shared pool when there is one)."""
        self._release()
        self._task = None

    # -- extras used by policies and fidelity ---------------------------------------------------

    def expert_action(self) -> str | None:
        """The next command of TextWorld's winning policy from the current state, if any."""
        if not self.expert:
            raise RuntimeError("this TextWorldEnv was made with expert=False (no plan)")
        if self._state is None or self._done:
            return None
        plan = self._state.get("policy_commands") or []
        return plan[0] if plan else None

    def _replay_form(self, action: str) -> str:
        return collapse(action)

    # -- helpers ---------------------------------------------------------------------------------

    def _observe(self, state: Any, feedback: str) -> tuple[str, str]:
        if self.state_format == "compact":
            # Moving or looking answers with "-= Room =-" and the room's description, which
            # the state already renders from the facts: keep what the feedback says before it.
            header = _HEADER.search(feedback)
            if header is not None:
                self._location = header.group(1)
                feedback = feedback[: header.start()]
            facts = state.get("facts") or []
            description, inventory = compact_description(facts), compact_inventory(facts)
            location = self._location
        else:
            location, description = split_description(state.get("description"))
            inventory = clean_inventory(state.get("inventory"))
            for part in (f"-= {location} =-", description):
                if part:
                    feedback = feedback.replace(part, " ")
        rest = collapse(feedback)
        shown = rest or f"You are in the {location}."
        return render_state(location, description, inventory, shown), location

    def _info(self, state: Any, feedback: str, location: str, valid: bool) -> dict[str, Any]:
        won, lost = bool(state.get("won")), bool(state.get("lost"))
        return self._room_info(valid, won, lost, feedback, location, self._norm_score)
