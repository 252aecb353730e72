"""ScienceWorld behind the Env / ReplayableEnv interface (Gymnasium 5-tuple semantics).

ScienceWorld (``scienceworld`` package) is a Scala simulator of elementary-science tasks,
shipped as a jar and driven over py4j. A Task names one *variation* of one task type:
``Task.family`` is the ScienceWorld task name (``find-animal``, ``boil``...) and
``Task.seed`` the variation index. The observation is a compact abstract state::

    Location: kitchen
    Here: a chair (On the chair is: nothing.); a counter ...; A door to the hallway (that is open)
    Inventory: an orange
    Feedback: <the simulator's answer to the last action>

Rewards are outcome-only by default (``reward="won"``): 1 on the step where the task is
completed with score 100, else 0; ``reward="score"`` returns the step's gain of the score
(0-1) instead; the info logs both. A negative score (e.g. focusing on the wrong object)
loses the episode. ``truncated`` after ``max_steps`` steps. ``reset task`` and the other
meta-commands (``episodic.META_VERBS``) never reach the simulator: the step is refused.

Determinism. Stock ScienceWorld is not replayable: objects are kept in hash sets keyed by
JVM identity hash codes, so listing order, gold paths and even temperatures differ between
two loads of the same variation. The engine is therefore started with
``-XX:hashCode=2`` (every identity hash is 1, hash sets iterate in insertion order), which
made every observation, gold path and valid-action list identical across reloads in our
checks at the same step cost. ``replay`` relies on it.

Admissible actions. ScienceWorld's own valid action-object combinations run to thousands
per state (``connect X to Y`` for every pair...) and cost ~0.25 s per state to compute, 5x
a step. ``admissible_actions`` is instead a bounded (``max_admissible``) list built from the
visible objects and their types (one cheap engine call): the expert's next gold action and
any other gold-path action that names only visible things, then look around / inventory /
wait1, ``go to`` rooms and open/close doors, per object the verbs its type supports
(pick up, focus on, look at, activate/deactivate devices, open/close/look in containers,
read documents), actions on inventory items (put down, focus on / move ... to a container /
use ... on), ``connect`` between electrical terminals (electrical tasks only), in a fixed
pseudo-random order within each group. The agent and the air are never objects.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
from typing import Any

from components.config.data import RewardMode
from components.envs.base import REWARD_WON, EnvError
from components.envs.episodic import EpisodicEnv, Step, collapse, normalize_command
from components.schema import Task

ENV_NAME = "scienceworld"
SCORE = "score"  # extra info key: ScienceWorld's task score in [-100, 100]

# every identity hash = 1: hash sets iterate in insertion order, so runs are replayable.
# A capped heap and the serial collector: the default heap (1/4 of RAM per JVM) let 48
# parallel JVMs fill 24 GiB; capped they use ~300 MB each and step ~3x faster (measured).
JVM_OPTIONS = (
    "-XX:+UnlockExperimentalVMOptions",
    "-XX:hashCode=2",
    "-Xmx256m",
    "-XX:+UseSerialGC",
)
INITIAL_ACTION = "look around"  # what ScienceWorld's own reset plays first
ALWAYS_ADMISSIBLE = ("look around", "inventory", "wait1")
UNKNOWN_ACTION = "No known action matches that input."
AMBIGUOUS = "Ambiguous request"
DEFAULT_MAX_ADMISSIBLE = 40

_NOISE_WORDS = frozenset({"agent", "air"})
_ELECTRICAL = ("power-component", "conductivity")
_TERMINALS = ("Anode", "Cathode", "Terminal")
_ARTICLE = re.compile(r"^(?:an?|the|some)\s+", re.IGNORECASE)
_PAREN = re.compile(r"\s*\(.*$")

_ROOM = re.compile(r"This (?:room|outside location) is called the ([^.]+)\.")
_CHOICE = re.compile(r"^\s*(\d+):", re.MULTILINE)


def split_look(look: str) -> tuple[str, str]:
    """(room name, the room's contents as one line without the agent and the air)."""
    match = _ROOM.search(look or "")
    location = match.group(1).strip() if match else "unknown"
    body = (look or "")[match.end() :] if match else (look or "")
    body = re.sub(r"^\s*(In it, you see:|Here you see:)", "", body.strip())
    items = []
    for raw in re.split(r"\n\t|\nYou also see:", body):
        item = collapse(raw).rstrip(".")
        if item and item not in ("the agent", "a substance called air", "You also see:"):
            items.append(item)
    return location, "; ".join(items)


def clean_inventory(raw: str) -> str:
    """``In your inventory, you see: an orange`` -> ``an orange`` (``nothing`` when empty)."""
    text = collapse(re.sub(r"^In your inventory, you see:", "", (raw or "").strip()))
    return text or "nothing"


def render_state(location: str, contents: str, inventory: str, feedback: str) -> str:
    """The abstract state text shown to agents and the experience model."""
    return f"Location: {location}\nHere: {contents}\nInventory: {inventory}\nFeedback: {feedback}"


def _stable_rank(text: str) -> str:
    return hashlib.sha1(text.encode("utf-8")).hexdigest()


def inventory_items(inventory: str) -> list[str]:
    """Names of the carried objects: ``an orange; a thermometer (reading ...)`` -> names."""
    items = []
    for part in re.split(r"[;\n\t]|, (?=an? |the )", inventory or ""):
        name = _PAREN.sub("", _ARTICLE.sub("", part.strip())).strip(" .,")
        if name and name != "nothing":
            items.append(name)
    return items


def candidate_actions(
    objects: dict[str, str], carried: list[str], location: str, task_name: str
) -> list[list[str]]:
    """Candidate actions in priority groups from ``{referent: type class}`` of visible things."""
    rooms, doors, devices, containers, terminals, things = [], [], [], [], [], []
    for name, kind in objects.items():
        if name in _NOISE_WORDS or kind.endswith(("agent.Agent", "substance.Air")):
            continue
        if ".location." in kind:
            if name != location:
                rooms.append(name)
            continue
        if ".portal." in kind:
            doors.append(name)
            continue
        if ".devices." in kind:
            devices.append(name)
        elif ".containers." in kind:
            containers.append(name)
        if ".electricalcomponent." in kind and kind.rsplit(".", 1)[-1] in _TERMINALS:
            terminals.append(name)
        things.append(name)
    groups: list[list[str]] = [list(ALWAYS_ADMISSIBLE)]
    groups.append(
        [f"go to {r}" for r in rooms] + [f"{v} {d}" for d in doors for v in ("open", "close")]
    )
    carried_refs = [f"{c} in inventory" for c in carried]
    groups.append(
        [f"put down {c}" for c in carried]
        + [f"{v} {c}" for c in carried_refs for v in ("focus on", "look at")]
    )
    single = []
    for t in things:
        single += [f"pick up {t}", f"focus on {t}", f"look at {t}"]
        if t in devices:
            single += [f"activate {t}", f"deactivate {t}"]
        if t in containers or t in devices:
            single += [f"open {t}", f"close {t}", f"look in {t}"]
        if "document" in objects.get(t, "") or "Book" in objects.get(t, ""):
            single.append(f"read {t}")
    groups.append(single)
    double = [f"move {c} to {t}" for c in carried_refs for t in containers + devices]
    double += [f"use {c} on {t}" for c in carried_refs for t in things]
    if any(k in task_name for k in _ELECTRICAL):
        double += [f"connect {a} to {b}" for a in terminals for b in terminals if a != b]
    groups.append(double)
    return groups


def select_admissible(groups: list[list[str]], preferred: list[str], limit: int) -> list[str]:
    """At most ``limit`` actions: ``preferred[0]`` (the expert's next), then the groups in
    order, each in a fixed pseudo-random order; returned sorted."""
    chosen: dict[str, str] = {}

    def take(action: str) -> None:
        key = normalize_command(action)
        if key and key not in chosen and len(chosen) < limit:
            chosen[key] = collapse(action)

    if preferred:
        take(preferred[0])
    for group in groups:
        for action in sorted(set(group), key=_stable_rank):
            take(action)
    return sorted(chosen.values())


class _Engine:
    """One ScienceWorld JVM reached over py4j (no callback server: nothing calls back)."""

    def __init__(self) -> None:
        try:
            from py4j.java_gateway import GatewayParameters, JavaGateway, launch_gateway
            from scienceworld.constants import BASEPATH, JAR_PATH
        except ImportError as err:  # pragma: no cover - the package is a project dependency
            raise EnvError(f"scienceworld is not installed: {err}") from err
        try:
            port, proc = launch_gateway(
                classpath=JAR_PATH,
                die_on_exit=True,
                cwd=BASEPATH,
                return_proc=True,
                javaopts=list(JVM_OPTIONS),
            )
        except Exception as err:
            raise EnvError(
                f"cannot start the ScienceWorld JVM ({err}); it needs Java >= 17: "
                "`make system-deps`"
            ) from err
        self.proc = proc
        self.gateway = JavaGateway(
            gateway_parameters=GatewayParameters(auto_field=True, port=port), java_process=proc
        )
        self.server = self.gateway.jvm.scienceworld.runtime.pythonapi.PythonInterface()

    @property
    def pid(self) -> int:
        """The JVM's process id (tests kill it to check crash recovery)."""
        return int(self.proc.pid)

    def close(self) -> None:
        """Stop the gateway and the JVM (a crashed one may fail to answer: ignored)."""
        with contextlib.suppress(Exception):
            self.gateway.shutdown()
        with contextlib.suppress(Exception):
            if self.proc.poll() is None:
                self.proc.kill()
            self.proc.wait(timeout=10)


class ScienceWorldEnv(EpisodicEnv):
    """A ScienceWorld task variation as a 5-tuple env with admissible actions, expert, replay."""

    name = ENV_NAME

    def __init__(
        self,
        max_steps: int,
        simplifications: str = "",
        max_admissible: int = DEFAULT_MAX_ADMISSIBLE,
        reward: RewardMode = REWARD_WON,
    ) -> None:
        super().__init__(max_steps, reward)
        if max_admissible < len(ALWAYS_ADMISSIBLE) + 1:
            raise ValueError(f"max_admissible must be >= {len(ALWAYS_ADMISSIBLE) + 1}")
        self.simplifications = simplifications
        self.max_admissible = max_admissible
        self._engine: _Engine | None = None
        self._task_name = ""
        self._gold: list[str] = []
        self._gold_pos = 0

    # -- the engine ----------------------------------------------------------------------

    def _server(self) -> Any:
        if self._engine is None:
            self._engine = _Engine()
        return self._engine.server

    @property
    def engine_pid(self) -> int | None:
        """The running JVM's pid, if one is running."""
        return self._engine.pid if self._engine is not None else None

    def _discard(self) -> None:
        """Drop the engine (after a crash); the next reset starts a fresh JVM."""
        engine, self._engine = self._engine, None
        self._done = True
        if engine is not None:
            engine.close()

    def _call(self, what: str, fn: Any, *args: Any) -> Any:
        """Run one engine call; any failure kills the engine and fails the episode."""
        try:
            return fn(*args)
        except Exception as err:  # py4j raises Py4JError subclasses, sockets OSError
            task_id = self._task.task_id if self._task else "?"
            self._discard()
            raise EnvError(f"ScienceWorld {what} failed on {task_id}: {err}") from err

    # -- Env -------------------------------------------------------------------------------

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Load ``task``'s variation (``task.seed``); ``seed`` is ignored (deterministic)."""
        del seed
        from scienceworld.utils import infer_task

        name = infer_task(task.family)
        server = self._server()
        self._task = task
        # A suite task carries its verified gold path (the engine is deterministic): asking
        # the engine to generate it again would double the cost of a load.
        known = list(task.walkthrough or [])
        self._call("load", server.load, name, int(task.seed), self.simplifications, not known)
        if known:
            self._gold = known
        else:
            self._gold = [str(a) for a in self._call("gold path", server.getGoldActionSequence)]
        feedback = str(self._call("step", server.step, INITIAL_ACTION))
        self._task_name = name
        self._history = []
        self._gold_pos = 0
        self._done = False
        self._norm_score = 0.0
        obs, info = self._observe(feedback, valid=True, score=0.0)
        return obs, info

    def _advance(self, action: str, limit: int | None) -> Step:
        self._require_running()
        server = self._server()
        command = collapse(action)
        kept: list[str] | None = None
        refusal = self._meta_refusal(command)
        if refusal is not None:
            # "reset task" would restart the task under the env's feet (history, gold path):
            # refused before the simulator, the state and its admissible list stay as they were
            feedback, score, completed = refusal, self._norm_score, False
            kept = list(self._admissible or [])
        else:
            # A newline would feed the parser two inputs (e.g. answer an ambiguity prompt).
            feedback = str(self._call("step", server.step, command))
            score = float(self._call("score", server.getScore))
            completed = bool(self._call("completed", server.getCompleted))
        if self._gold_pos < len(self._gold) and normalize_command(command) == normalize_command(
            self._gold[self._gold_pos]
        ):
            self._gold_pos += 1
        self._history.append(command)
        won = completed and score >= 1.0
        lost = score < 0
        terminated = won or lost or completed
        truncated = not terminated and limit is not None and len(self._history) >= limit
        self._done = terminated or truncated
        valid = kept is None and not feedback.strip().startswith(UNKNOWN_ACTION)
        obs, info = self._observe(feedback, valid, score, terminated, admissible=kept)
        return obs, self._scored(won, score), terminated, truncated, info

    def close(self) -> None:
        """Stop the JVM."""
        self._discard()
        self._task = None

    # -- extras used by policies and fidelity ---------------------------------------------

    @property
    def gold_path(self) -> list[str]:
        """ScienceWorld's gold action sequence for the current episode."""
        return list(self._gold)

    def variations(self, task_name: str, split: str) -> list[int]:
        """ScienceWorld's own variation list of ``task_name`` for ``split``
        (train / validation = its dev list / test); ends the current episode."""
        from scienceworld.utils import infer_task

        getter = {
            "train": "getVariationsTrain",
            "validation": "getVariationsDev",
            "test": "getVariationsTest",
        }[split]
        server = self._server()
        self._done = True
        self._call("load", server.load, infer_task(task_name), 0, self.simplifications, False)
        return [int(v) for v in self._call("variations", getattr(server, getter))]

    @property
    def task_description(self) -> str:
        """The loaded variation's task description (``Your task is to ...``)."""
        return " ".join(str(self._call("task", self._server().getTaskDescription)).split())

    def expert_action(self) -> str | None:
        """The next gold-path action (the pointer moves only when that action is played)."""
        if self._done or self._gold_pos >= len(self._gold):
            return None
        return self._gold[self._gold_pos]

    def _replay_form(self, action: str) -> str:
        return collapse(action)

    # -- helpers ---------------------------------------------------------------------------

    def _observe(
        self,
        feedback: str,
        valid: bool,
        score: float,
        terminated: bool = False,
        admissible: list[str] | None = None,
    ) -> tuple[str, dict[str, Any]]:
        server = self._server()
        look = str(self._call("look", server.freeActionLook))
        inventory = clean_inventory(str(self._call("inventory", server.freeActionInventory)))
        location, contents = split_look(look)
        raw_feedback = feedback
        shown = collapse(feedback)
        if shown.startswith("This room is called") or shown.startswith("This outside location"):
            shown = f"You look around the {location}."  # the description is already in the state
        if terminated:
            self._admissible = []
        elif admissible is not None:  # a refused command: the list stays as it was
            self._admissible = admissible
        elif raw_feedback.strip().startswith(AMBIGUOUS):
            self._admissible = sorted(set(_CHOICE.findall(raw_feedback)), key=int)
        else:
            raw = self._call("objects", server.getPossibleObjectReferentTypesLUTJSON)
            objects = {
                str(ref): str(entry.get("desc", ""))
                for entry in json.loads(str(raw)).values()
                for key, ref in entry.items()
                if key != "desc"
            }
            groups = candidate_actions(
                objects, inventory_items(inventory), location, self._task_name
            )
            self._admissible = select_admissible(
                groups, self._gold[self._gold_pos : self._gold_pos + 1], self.max_admissible
            )
        obs = render_state(location, contents, inventory, shown)
        won, lost = score >= 1.0 and terminated, score < 0
        info = self._room_info(
            valid, won, lost, shown, location, score, {SCORE: round(score * 100)}
        )
        return obs, info
