"""MiniWoB++ in real headless Chromium behind the Env / ReplayableEnv interface.

The task pages ship in the ``miniwob`` package; Debian's ``chromium`` and
``chromium-driver`` run them headless (``make system-deps``), driven by Selenium with no
driver download (``SE_OFFLINE``) and no background networking. One browser per env
instance. A Task names one MiniWoB task (``Task.family``, e.g. ``login-user``) and one
episode seed (``Task.seed``): the page is reloaded and ``Math.seedrandom(seed)`` set
before the episode starts, so the same task gives the same page, instruction and element
ids every time (``replay`` = reset with the same seed, then re-apply the prefix).
MiniWoB's real-time episode limit is lifted (agents may think slowly); ``max_steps``
truncates instead.

Observation: 3-20 relevant elements of the task area as ``[id] type: text`` lines
(interactive ones first: text fields with their value, checkboxes/radios with their
label and state, selects with their options, buttons, links, tree items, menu options;
then static text), and a ``Feedback:`` line. Ids are MiniWoB's element refs; a run of
text beside other elements is a text node with a negative id (``click [-2]`` is invalid:
only elements can be clicked), numbered afresh in page order on every observation.

Actions, parsed strictly (anything else is invalid: no browser action, state unchanged):

* ``click [id]``            -> MiniWoB CLICK_ELEMENT (invalid where it fails: a text node)
* ``type [id] "text"``      -> CLICK_ELEMENT, PRESS_KEY C-a, TYPE_TEXT (replaces the value)
* ``select [id] "option"``  -> picks the option of a ``<select>`` (as Selenium's Select does)
* ``press [id] key``        -> CLICK_ELEMENT, PRESS_KEY (Enter, Tab, Backspace, Delete,
  Space, ArrowUp/Down/Left/Right, PageUp/PageDown)

Reward: 1 on the step that ends the episode with MiniWoB's raw reward 1 (success), else 0;
an episode ended with a lower raw reward is lost. Scripted experts (``miniwob_experts.py``,
one per supported task) give the collection policy's next action; tasks without
one return None (the collection policies then act randomly).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from components.config.base import fields_of
from components.envs.base import ADMISSIBLE, FEEDBACK, LOST, VALID, WON, EnvError
from components.envs.episodic import EpisodicEnv, Step
from components.envs.miniwob_browser import (
    CHROME_FLAGS,  # noqa: F401  (re-exported)
    DEFAULT_CHROME,
    DEFAULT_CHROMEDRIVER,
    kill_profile_processes,
    quit_driver,
    start_chromium,
)
from components.envs.miniwob_dom import (
    MAX_ADMISSIBLE,  # noqa: F401  (re-exported)
    MAX_TEXT,  # noqa: F401  (re-exported)
    TEXT_INPUTS,
    Element,
    ParsedAction,  # noqa: F401  (re-exported)
    admissible_actions,
    extract_elements,
    parse_action,
    quoted,  # noqa: F401  (re-exported)
    render_state,
)
from components.envs.miniwob_experts import (
    EXPERTS,
    ExpertFn,  # noqa: F401  (re-exported)
    ExpertView,
)
from components.schema import Task

ENV_NAME = "miniwob"
UTTERANCE = "utterance"  # extra info key: MiniWoB's instruction for this seed
MOVES = "moves"  # extra info key: steps taken in this episode
RAW_REWARD = "raw_reward"  # extra info key: MiniWoB's raw reward once done

NO_TIME_LIMIT_MS = 1_000_000_000  # < 2**31: setTimeout would fire at once above that
KEYS = {
    "enter": "<Enter>",
    "tab": "<Tab>",
    "backspace": "<Backspace>",
    "delete": "<Delete>",
    "space": "<Space>",
    "arrowup": "<ArrowUp>",
    "arrowdown": "<ArrowDown>",
    "arrowleft": "<ArrowLeft>",
    "arrowright": "<ArrowRight>",
    "pageup": "<PageUp>",
    "pagedown": "<PageDown>",
}


# Select options are not boxes MiniWoB sees: read them (and set them) in the page.
_SELECT_OPTIONS_JS = """
var out = {};
document.querySelectorAll('#area select').forEach(function (s) {
  if (s.dataset.wob_ref !== undefined)
    out[s.dataset.wob_ref] = [Array.from(s.options).map(function (o) { return o.text; }),
                              s.selectedIndex];
});
return out;
"""
_SELECT_JS = """
var el = core.previousDOMInfo[arguments[0]];
var i = Array.from(el.options).map(function (o) { return o.text; }).indexOf(arguments[1]);
if (i < 0) return false;
el.focus(); el.selectedIndex = i;
el.dispatchEvent(new Event('input', {bubbles: true}));
el.dispatchEvent(new Event('change', {bubbles: true}));
return true;
"""
_STATUS_JS = (
    "return [WOB_DONE_GLOBAL, WOB_RAW_REWARD_GLOBAL, WOB_REWARD_REASON, core.getUtterance()];"
)


class MiniWoBEnv(EpisodicEnv):
    """A MiniWoB++ task in headless Chromium: text actions, admissible actions, expert, replay."""

    name = ENV_NAME

    def __init__(
        self,
        max_steps: int,
        max_elements: int = 20,
        chrome_binary: str = DEFAULT_CHROME,
        chromedriver: str = DEFAULT_CHROMEDRIVER,
        timeout_s: float = 30.0,
    ) -> None:
        super().__init__(max_steps)
        if max_elements < 3:
            raise ValueError("max_elements must be >= 3")
        self.max_elements = max_elements
        self.chrome_binary = chrome_binary
        self.chromedriver = chromedriver
        self.timeout_s = timeout_s
        self._driver: Any = None
        self._profile_dir: str | None = None
        self._utterance = ""
        self._elements: list[Element] = []

    @classmethod
    def from_config(cls, env_cfg: Any) -> MiniWoBEnv:
        """An env from ``EnvConfig`` (``env_cfg.miniwob`` holds the browser settings)."""
        browser = ("max_elements", "chrome_binary", "chromedriver", "timeout_s")
        return cls(max_steps=env_cfg.max_steps, **fields_of(env_cfg.miniwob, *browser))

    # -- the browser ---------------------------------------------------------------------

    def _browser(self) -> Any:
        if self._driver is not None:
            return self._driver
        self._driver, self._profile_dir = start_chromium(
            self.chrome_binary, self.chromedriver, self.timeout_s
        )
        return self._driver

    @property
    def profile_dir(self) -> str | None:
        """The running browser's own temporary profile directory (None without a browser)."""
        return self._profile_dir

    @property
    def driver_pid(self) -> int | None:
        """The chromedriver process id, if a browser runs (tests kill it)."""
        if self._driver is None:
            return None
        process = getattr(self._driver.service, "process", None)
        return int(process.pid) if process is not None else None

    def _kill_browser_processes(self) -> None:
        """Kill the chromedriver and the Chromium processes of *this* env's profile dir."""
        if self._profile_dir is None:
            return
        kill_profile_processes(self._profile_dir)
        self._profile_dir = None

    def _discard(self) -> None:
        """Drop the browser (after a crash); the next reset starts a fresh one."""
        driver, self._driver = self._driver, None
        self._done = True
        if driver is not None:
            quit_driver(driver)
        self._kill_browser_processes()

    def _call(self, fn: Callable[..., Any], *args: Any) -> Any:
        """Run one browser operation; any failure kills the browser and fails the episode."""
        try:
            return fn(*args)
        except EnvError:
            raise
        except Exception as err:  # WebDriverException, urllib3 errors after a crash...
            task_id = self._task.task_id if self._task else "?"
            self._discard()
            raise EnvError(f"browser failed on {task_id}: {type(err).__name__}: {err}") from err

    def _js(self, script: str, *args: Any) -> Any:
        """Run a script in the page; any browser failure fails the episode (EnvError)."""
        return self._call(lambda: self._browser().execute_script(script, *args))

    def _settle(self) -> None:
        """Wait until zero-delay timers queued by the action ran (autocomplete menus...), so
        the observation does not depend on timing and replays see the same page."""
        self._call(
            lambda: self._browser().execute_async_script(
                "var done = arguments[0]; setTimeout(function () { setTimeout(done, 0); }, 0);"
            )
        )

    def _click(self, ref: int) -> bool:
        """MiniWoB's CLICK_ELEMENT on ``ref``; False where it fails (a text node is no
        element), which the package only logs as a warning."""
        return self._js("return core.elementClick(arguments[0]);", ref) is True

    def _perform(self, action: dict[str, Any]) -> None:
        from miniwob.selenium_actions import execute_action_on_chromedriver

        self._call(
            lambda: execute_action_on_chromedriver(action, [], _action_config(), self._browser())
        )

    # -- Env -------------------------------------------------------------------------------

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Load ``task.family``'s page and start the episode of seed ``task.seed``."""
        del seed  # the task's own seed defines the instance
        url = task_url(task.family)
        driver = self._browser()
        self._task = task
        try:
            driver.get(url)
        except Exception as err:
            self._discard()
            raise EnvError(f"cannot load {url}: {err}") from err
        self._js(
            "Math.seedrandom(arguments[0]); core.EPISODE_MAX_TIME = arguments[1];"
            "core.startEpisodeReal();",
            int(task.seed),
            NO_TIME_LIMIT_MS,
        )
        for _ in range(40):  # tasks may flag WOB_TASK_READY late (MiniWoB waits 1 s at most)
            if self._js("return WOB_TASK_READY;"):
                break
            time.sleep(0.025)
        self._history = []
        self._done = False
        done, raw, _, utterance = self._js(_STATUS_JS)
        self._utterance = str(utterance)
        return self._observe("The page is loaded.", valid=True, done=bool(done), raw=raw)

    def _advance(self, action: str, limit: int | None) -> Step:
        self._require_running()
        command = action.strip()
        feedback, valid = self._apply(command)
        if valid:
            self._settle()
        self._history.append(command)
        done, raw, _, _ = self._js(_STATUS_JS)
        obs, info = self._observe(feedback, valid=valid, done=bool(done), raw=raw)
        won, terminated = info[WON], bool(done)
        truncated = not terminated and limit is not None and len(self._history) >= limit
        self._done = terminated or truncated
        if terminated:
            self._admissible = []
            info[ADMISSIBLE] = []
        return obs, int(won), terminated, truncated, info

    def _apply(self, command: str) -> tuple[str, bool]:
        """Run a parsed action in the browser; (feedback, valid)."""
        parsed = parse_action(command)
        if parsed is None:
            return (
                'Invalid action: use click [id], type [id] "text", select [id] "option" '
                "or press [id] key.",
                False,
            )
        element = next((e for e in self._elements if e.ref == parsed.ref), None)
        if element is None:
            return f"Invalid action: no element [{parsed.ref}] on the page.", False
        from miniwob.action import ActionTypes

        config = _action_config()
        key = KEYS.get(parsed.arg.lower()) if parsed.verb == "press" else None
        if parsed.verb == "press" and key is None:
            return f"Invalid action: unknown key {parsed.arg!r}; keys: {sorted(KEYS)}.", False
        if parsed.verb in ("click", "press") and not self._click(element.ref):
            return f"Invalid action: [{element.ref}] {element.kind} cannot be clicked.", False
        if parsed.verb == "click":
            return f"Clicked [{element.ref}] {element.kind}.", True
        if parsed.verb == "type":
            if element.kind not in TEXT_INPUTS:
                return (
                    f"Invalid action: [{element.ref}] is a {element.kind}, not a text field.",
                    False,
                )
            self._click(element.ref)  # a text field: always an element
            self._perform(_mw_action(config, ActionTypes.PRESS_KEY, key=_key_index("C-a")))
            if parsed.arg:
                self._perform(_mw_action(config, ActionTypes.TYPE_TEXT, text=parsed.arg))
            else:  # typing nothing over the selection leaves it: erase it, as the dream does
                self._perform(
                    _mw_action(config, ActionTypes.PRESS_KEY, key=_key_index("<Backspace>"))
                )
            return f'Typed "{parsed.arg}" into [{element.ref}].', True
        if parsed.verb == "select":
            if element.kind != "select":
                return f"Invalid action: [{element.ref}] is a {element.kind}, not a select.", False
            if parsed.arg not in element.options:
                return f'Invalid action: [{element.ref}] has no option "{parsed.arg}".', False
            self._js(_SELECT_JS, element.ref, parsed.arg)
            return f'Selected "{parsed.arg}" in [{element.ref}].', True
        self._perform(_mw_action(config, ActionTypes.PRESS_KEY, key=_key_index(key)))
        return f"Pressed {parsed.arg} on [{element.ref}].", True

    def close(self) -> None:
        """Quit the browser."""
        self._discard()
        self._task = None

    # -- extras used by policies and fidelity ---------------------------------------------

    @property
    def utterance(self) -> str:
        """MiniWoB's instruction for the current episode."""
        return self._utterance

    @property
    def elements(self) -> list[Element]:
        """The elements of the current state."""
        return list(self._elements)

    def expert_action(self) -> str | None:
        """The scripted expert's next action for this task, if the task has one."""
        if self._task is None or self._done:
            return None
        expert = EXPERTS.get(self._task.family)
        if expert is None:
            return None
        return expert(
            ExpertView(self._utterance, list(self._elements), list(self._history), self._js)
        )

    # -- helpers ---------------------------------------------------------------------------

    def _observe(
        self, feedback: str, valid: bool, done: bool, raw: Any
    ) -> tuple[str, dict[str, Any]]:
        # MiniWoB numbers text nodes on from the last call; from -1 again, an unchanged
        # page reads the same and a replay the same as live stepping
        dom = self._js("core.nextTextRefCode = -1; return core.getDOMInfo();")
        selects = self._js(_SELECT_OPTIONS_JS) or {}
        self._elements = extract_elements(dom, selects, self.max_elements)
        raw_reward = float(raw or 0.0)
        won = done and raw_reward >= 1.0
        if done:
            feedback = f"{feedback} The episode is over: {'success' if won else 'failure'}."
        self._admissible = [] if done else admissible_actions(self._elements, self._utterance)
        obs = render_state(self._elements, feedback)
        info = {
            ADMISSIBLE: list(self._admissible),
            VALID: valid,
            WON: won,
            LOST: done and not won,
            FEEDBACK: feedback,
            UTTERANCE: self._utterance,
            MOVES: len(self._history),
            RAW_REWARD: raw_reward if done else 0.0,
        }
        return obs, info


def task_url(task_name: str) -> str:
    """The file:// URL of a MiniWoB task page shipped in the package."""
    import miniwob

    page = Path(miniwob.__file__).parent / "html" / "miniwob" / f"{task_name}.html"
    if not page.is_file():
        raise EnvError(f"unknown MiniWoB task {task_name!r} (no {page.name} in the package)")
    return page.as_uri()


def _action_config() -> Any:
    from miniwob.action import ActionSpaceConfig, ActionTypes

    return ActionSpaceConfig(
        action_types=[ActionTypes.CLICK_ELEMENT, ActionTypes.PRESS_KEY, ActionTypes.TYPE_TEXT]
    )


def _key_index(key: str) -> int:
    from miniwob.constants import DEFAULT_ALLOWED_KEYS

    return DEFAULT_ALLOWED_KEYS.index(key)


def _mw_action(config: Any, action_type: Any, **fields: Any) -> dict[str, Any]:
    """A MiniWoB action dict (the package's action-space encoding)."""
    return {"action_type": config.action_types.index(action_type), **fields}
