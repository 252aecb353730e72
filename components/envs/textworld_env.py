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

import re
from dataclasses import replace
from pathlib import Path
from typing import Any

from components.config.data import RewardMode
from components.envs.base import REWARD_WON, EnvError, normalised_score
from components.envs.episodic import EpisodicEnv, Step, collapse, normalize_command
from components.envs.textworld_engines import Answer, Engine, EnginePool, GameKey, Node, intern_all
from components.envs.textworld_speedups import use_keyed_fact_sort
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


class TextWorldEnv(EpisodicEnv):
    """A TextWorld game as a 5-tuple env with admissible actions, an expert and replay.

    Answers are read from the factory's ``EnginePool`` trees when the command path was
    played before (textworld_engines.py); an engine runs only the paths that are new.
    """

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
        # shared with the other envs of a factory; a lone env keeps its own answers and
        # closes its engine when it lets it go
        self._engines = engines if engines is not None else EnginePool(max_idle=0)
        self._engine_held: Engine | None = None  # reused while the game is the same
        self._game_path: str | None = None  # the game of the held engine
        self._key: GameKey | None = None  # the game of the episode
        self._sent: tuple[str, ...] = ()  # commands the episode sent to the game
        self._node: Node | None = None  # their answer in the tree (None: not kept)
        self._answer: Answer | None = None

    @property
    def _tw(self) -> Any:
        """The held engine's TextWorld environment (None: no engine held)."""
        return None if self._engine_held is None else self._engine_held.tw

    # -- paths and the engine ------------------------------------------------------------

    def resolve_game_file(self, task: Task) -> Path:
        """The game file of ``task``, resolving a relative path against ``root`` (or cwd)."""
        if not task.game_file:
            raise EnvError(f"task {task.task_id} has no game_file")
        path = Path(task.game_file)
        if not path.is_absolute():
            path = (self.root or Path.cwd()) / path
        return path

    def _engine(self, path: Path) -> Engine:
        if self._engine_held is not None and self._game_path == str(path):
            return self._engine_held
        self._release()
        reused = self._engines.take((str(path), self.expert, self.state_format))
        if reused is not None:
            self._engine_held, self._game_path = reused, str(path)
            return reused
        import textworld  # heavy import kept to this module

        use_keyed_fact_sort()

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
            tw = textworld.start(str(path), request_infos=infos)
        except Exception as err:
            raise EnvError(f"cannot start {path}: {err}") from err
        # Jericho would re-run "look" and "inventory" after every command for games it
        # "fully supports"; TextWorld's Inform7 wrapper already reads both from the game's
        # own output, so this only triples the cost of a step.
        frotz = getattr(getattr(tw, "unwrapped", None), "_jericho", None)
        if frotz is not None and hasattr(frotz, "is_fully_supported"):
            frotz.is_fully_supported = False
        self._engines.share_valid_actions(str(path), tw)
        self._engine_held, self._game_path = Engine(tw), str(path)
        return self._engine_held

    def _release(self) -> None:
        """Give a healthy engine back to the pool (a lone env's pool closes it)."""
        if self._engine_held is not None and self._game_path is not None:
            engine, path = self._engine_held, self._game_path
            self._engine_held, self._game_path = None, None
            self._engines.give((path, self.expert, self.state_format), engine)

    def _discard(self) -> None:
        """Drop the engine after an error (the episode ends; the next reset restarts it)."""
        engine, self._engine_held, self._game_path = self._engine_held, None, None
        self._done = True
        if engine is not None:
            engine.close()

    def _answer_of(self, state: dict[str, Any]) -> Answer:
        if self.state_format == "compact":
            facts = state.get("facts") or []
            description, inventory = compact_description(facts), compact_inventory(facts)
        else:
            description, inventory = state.get("description") or "", state.get("inventory") or ""
        return Answer(
            feedback=state.get("feedback") or "",
            description=description,
            inventory=inventory,
            admissible=intern_all(sorted(state.get("admissible_commands") or [])),
            won=bool(state.get("won")),
            lost=bool(state.get("lost")),
            score=state.get("score"),
            max_score=state.get("max_score"),
            objective=state.get("objective"),
            plan=intern_all(state.get("policy_commands")) if self.expert else (),
        )

    def _play(self, task: Task, command: str | None) -> Answer:
        """Run the game along the episode's commands, then ``command`` (None: the reset)."""
        path = self.resolve_game_file(task)
        engine = self._engine(path)
        try:
            if command is None or engine.at is None or engine.at != self._sent[: len(engine.at)]:
                state = engine.tw.reset()
                engine.at = ()
            for missed in self._sent[len(engine.at) :]:  # answered from the tree so far
                engine.tw.step(missed)
            engine.at = self._sent
            if command is not None:
                state, _, _ = engine.tw.step(command)
                engine.at = (*self._sent, command)
            self._engines.played += 1
        except Exception as err:
            self._discard()
            what = "reset" if command is None else f"step {command!r}"
            raise EnvError(f"{what} failed on {task.task_id}: {err}") from err
        return self._answer_of(state)

    # -- Env -------------------------------------------------------------------------------

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start ``task``'s game; ``seed`` is ignored (TextWorld games are deterministic)."""
        del seed
        key = (str(self.resolve_game_file(task)), self.expert, self.state_format)
        if self._game_path is not None and self._game_path != key[0]:
            self._release()  # another env may need that game's engine meanwhile
        self._sent = ()
        node = self._engines.known(key)
        if node is None:
            answer = self._play(task, None)
            node = self._engines.remember(key, answer)
        else:
            answer = node.answer
        self._key, self._node, self._answer = key, node, answer
        self._task = task
        self._history = []
        self._done = False
        self._location = "unknown"  # until the first "-= Room =-" header
        self._norm_score = normalised_score(answer.score, answer.max_score)
        self._admissible = list(answer.admissible)
        objective = answer.objective or task.instruction
        feedback = clean_feedback(answer.feedback, objective)
        obs, location = self._observe(answer, feedback)
        info = self._info(answer, feedback, location, valid=True)
        return obs, info

    def _advance(self, action: str, limit: int | None) -> Step:
        task = self._require_running()
        assert self._answer is not None and self._key is not None
        # control characters can crash the Z-machine interpreter (segfault on "go\x13")
        command = collapse("".join(ch if ch.isprintable() else " " for ch in action))
        valid = normalize_command(command) in {normalize_command(a) for a in self._admissible}
        refusal = self._meta_refusal(command)
        if refusal is not None:
            # quit/restart would lock the game in a yes/no prompt or desync the tracked
            # state, save/script write files: refused, the state stays as it was
            answer = replace(self._answer, feedback=refusal)
        elif not valid and _CHAINED.search(command):
            # Inform7 would run "go east. take key" as two commands in one step; refuse it
            # so one step is always one action (the state stays as it was).
            answer = replace(self._answer, feedback=CHAINED_FEEDBACK)
        else:
            node = None if self._node is None else self._engines.known_after(self._node, command)
            if node is not None:
                answer = node.answer
            else:
                answer = self._play(task, command)
                if self._node is not None:
                    node = self._engines.remember_after(self._node, command, answer)
            self._sent, self._node = (*self._sent, command), node
        self._history.append(command)
        self._answer = answer
        terminated = answer.won or answer.lost
        truncated = not terminated and limit is not None and len(self._history) >= limit
        self._done = terminated or truncated
        self._admissible = [] if terminated else list(answer.admissible)
        feedback = clean_feedback(answer.feedback)
        obs, location = self._observe(answer, feedback)
        reward = self._scored(answer.won, normalised_score(answer.score, answer.max_score))
        info = self._info(answer, feedback, location, valid=valid)
        return obs, reward, terminated, truncated, info

    def close(self) -> None:
        """Release the game engine (back to the shared pool when there is one)."""
        self._release()
        self._task = None
        self._done = True

    # -- extras used by policies and fidelity ---------------------------------------------------

    def expert_action(self) -> str | None:
        """The next command of TextWorld's winning policy from the current state, if any."""
        if not self.expert:
            raise RuntimeError("this TextWorldEnv was made with expert=False (no plan)")
        if self._answer is None or self._done:
            return None
        plan = self._answer.plan
        return plan[0] if plan else None

    def _replay_form(self, action: str) -> str:
        return collapse(action)

    # -- helpers ---------------------------------------------------------------------------------

    def _observe(self, answer: Answer, feedback: str) -> tuple[str, str]:
        if self.state_format == "compact":
            # Moving or looking answers with "-= Room =-" and the room's description, which
            # the state already renders from the facts: keep what the feedback says before it.
            header = _HEADER.search(feedback)
            if header is not None:
                self._location = header.group(1)
                feedback = feedback[: header.start()]
            description, inventory = answer.description, answer.inventory
            location = self._location
        else:
            location, description = split_description(answer.description)
            inventory = clean_inventory(answer.inventory)
            for part in (f"-= {location} =-", description):
                if part:
                    feedback = feedback.replace(part, " ")
        rest = collapse(feedback)
        shown = rest or f"You are in the {location}."
        return render_state(location, description, inventory, shown), location

    def _info(self, answer: Answer, feedback: str, location: str, valid: bool) -> dict[str, Any]:
        return self._room_info(valid, answer.won, answer.lost, feedback, location, self._norm_score)
