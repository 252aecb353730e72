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
then static text), and a ``Feedback:`` line. Ids are MiniWoB's element refs.

Actions, parsed strictly (anything else is invalid: no browser action, state unchanged):

* ``click [id]``            -> MiniWoB CLICK_ELEMENT
* ``type [id] "text"``      -> CLICK_ELEMENT, PRESS_KEY C-a, TYPE_TEXT (replaces the value)
* ``select [id] "option"``  -> picks the option of a ``<select>`` (as Selenium's Select does)
* ``press [id] key``        -> CLICK_ELEMENT, PRESS_KEY (Enter, Tab, Backspace, Delete,
  Space, ArrowUp/Down/Left/Right, PageUp/PageDown)

Reward: 1 on the step that ends the episode with MiniWoB's raw reward 1 (success), else 0;
an episode ended with a lower raw reward is lost. Scripted experts (``miniwob_experts``
below, one per supported task) give the collection policy's next action; tasks without
one return None (the collection policies then act randomly).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from components.envs.base import ADMISSIBLE, FEEDBACK, LOST, VALID, WON, EnvError
from components.envs.episodic import EpisodicEnv, Step, collapse
from components.schema import Task

ENV_NAME = "miniwob"
UTTERANCE = "utterance"  # extra info key: MiniWoB's instruction for this seed
MOVES = "moves"  # extra info key: steps taken in this episode
RAW_REWARD = "raw_reward"  # extra info key: MiniWoB's raw reward once done

DEFAULT_CHROME = "/usr/lib/chromium/chromium"  # the real binary; /usr/bin/chromium is a wrapper
DEFAULT_CHROMEDRIVER = "/usr/bin/chromedriver"
CHROME_FLAGS = (
    "--headless=new",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-dev-shm-usage",
    # the machine has no network: without these Chromium keeps dialing Google services
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-default-apps",
    "--disable-extensions",
    "--no-first-run",
    "--window-size=500,400",
)
NO_TIME_LIMIT_MS = 1_000_000_000  # < 2**31: setTimeout would fire at once above that
MAX_TEXT = 60  # characters of an element's text shown in the state
MAX_ADMISSIBLE = 40
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

_CLICK = re.compile(r"^click \[(-?\d+)\]$")
_TEXT_ARG = re.compile(r'^(type|select) \[(-?\d+)\] "(.*)"$', re.DOTALL)
_PRESS = re.compile(r"^press \[(-?\d+)\] ([A-Za-z]+)$")
_QUOTED = re.compile(r'"([^"]+)"')

TEXT_INPUTS = ("textbox", "password", "textarea", "number", "email", "search", "date", "time")
_INPUT_TYPES = {
    "input_text": "textbox",
    "input_password": "password",
    "input_number": "number",
    "input_email": "email",
    "input_search": "search",
    "input_date": "date",
    "input_time": "time",
    "input_checkbox": "checkbox",
    "input_radio": "radio",
    "input_submit": "button",
    "input_button": "button",
    "textarea": "textarea",
    "select": "select",
    "button": "button",
    "a": "link",
}
_SKIP_IDS = {"query", "reward-display", "sync-task-cover", "click-canvas"}

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


@dataclass(frozen=True)
class Element:
    """One element shown in the abstract state."""

    ref: int
    kind: str  # textbox, password, checkbox, radio, select, button, link, folder, ...
    text: str
    value: str | None = None  # text fields: the value; checkbox/radio: "true"/"false"
    options: tuple[str, ...] = ()  # select: its options
    classes: str = ""
    interactive: bool = True

    def render(self) -> str:
        """``[id] type: text``."""
        if self.kind in TEXT_INPUTS:
            label = f"{self.text} " if self.text else ""
            body = f'{label}"{self.value or ""}"'
        elif self.kind in ("checkbox", "radio"):
            body = f"{self.text} ({'checked' if self.value == 'true' else 'unchecked'})"
        elif self.kind == "select":
            chosen = self.value or ""
            body = f'"{chosen}" (options: {" | ".join(self.options)})'
        else:
            body = self.text
        return f"[{self.ref}] {self.kind}: {body}"

    @property
    def checked(self) -> bool:
        """A checkbox or radio that is on."""
        return self.value == "true"


def _text_of(node: dict[str, Any]) -> str:
    if node.get("text"):
        return collapse(str(node["text"]))
    return collapse(" ".join(_text_of(c) for c in node.get("children", [])))


def extract_elements(root: dict[str, Any], selects: dict[str, Any], limit: int) -> list[Element]:
    """The relevant elements of the task area from MiniWoB's DOM info, in page order:
    interactive ones first, then static text, at most ``limit``."""
    interactive: list[Element] = []
    static: list[Element] = []

    def label_for(node: dict[str, Any], parent: dict[str, Any] | None) -> str:
        if parent is None:
            return ""
        siblings = parent.get("children", [])
        if parent.get("tag", "").lower() == "label":  # <label><input>text</label>
            return collapse(" ".join(_text_of(s) for s in siblings if s is not node))
        i = next((k for k, s in enumerate(siblings) if s is node), -1)
        if i > 0 and siblings[i - 1].get("tag", "").lower() == "label":
            return _text_of(siblings[i - 1])
        return ""

    def visit(node: dict[str, Any], parent: dict[str, Any] | None, in_area: bool) -> None:
        if node.get("id") in _SKIP_IDS:
            return
        in_area = in_area or node.get("id") == "area"
        tag = str(node.get("tag", "")).lower()
        classes = str(node.get("classes") or "")
        ref = int(node.get("ref", 0))
        kind = _INPUT_TYPES.get(tag)
        text = _text_of(node)[:MAX_TEXT]
        if in_area and kind is not None:
            value = node.get("value")
            options: tuple[str, ...] = ()
            if kind == "select":
                opts, index = selects.get(str(ref), ([], -1))
                options = tuple(str(o) for o in opts)
                value = options[index] if 0 <= index < len(options) else ""
            elif kind in ("checkbox", "radio"):
                value = "true" if value else "false"
                text = label_for(node, parent)
            elif kind in TEXT_INPUTS:
                text = label_for(node, parent)
            interactive.append(
                Element(ref, kind, text, None if value is None else str(value), options, classes)
            )
            return
        if in_area and "hitarea" in classes and parent is not None:
            folder = next(
                (c for c in parent["children"] if c.get("tag", "").lower() == "span"), None
            )
            name = _text_of(folder) if folder else ""
            state = "collapsed" if "expandable" in classes else "expanded"
            interactive.append(Element(ref, "toggle", f"{name} ({state})", classes=classes))
            return
        if in_area and tag == "span" and ("folder" in classes or "file" in classes):
            kind = "folder" if "folder" in classes else "file"
            interactive.append(Element(ref, kind, text, classes=classes))
            return
        if tag == "li" and "ui-menu-item" in classes:  # jQuery UI autocomplete / menus
            interactive.append(Element(ref, "option", text, classes=classes))
            return
        children = node.get("children", [])
        if in_area and not children and text and tag not in ("label",) and ref > 0:
            static.append(Element(ref, "text", text, classes=classes, interactive=False))
            return
        if in_area and not children and text and tag == "t":
            static.append(Element(ref, "text", text, classes=classes, interactive=False))
            return
        for child in children:
            visit(child, node, in_area)

    visit(root, None, False)
    # label elements of inputs are already shown with their input
    labels = {e.text for e in interactive if e.kind in (*TEXT_INPUTS, "checkbox", "radio")}
    static = [e for e in static if e.text not in labels]
    return (interactive + static)[:limit]


def render_state(elements: list[Element], feedback: str) -> str:
    """The abstract state: one ``[id] type: text`` line per element, then the feedback."""
    lines = [e.render() for e in elements] or ["(no elements)"]
    return "\n".join([*lines, f"Feedback: {feedback}"])


@dataclass(frozen=True)
class ParsedAction:
    """A text action, parsed."""

    verb: str  # click | type | select | press
    ref: int
    arg: str = ""


def parse_action(action: str) -> ParsedAction | None:
    """Strict parse of ``click [id]`` / ``type [id] "text"`` / ``select [id] "opt"`` /
    ``press [id] key``; None when malformed."""
    text = action.strip()
    if m := _CLICK.match(text):
        return ParsedAction("click", int(m.group(1)))
    if m := _TEXT_ARG.match(text):
        arg = m.group(3)
        if "\n" in arg:
            return None
        return ParsedAction(m.group(1), int(m.group(2)), arg.replace('\\"', '"'))
    if m := _PRESS.match(text):
        return ParsedAction("press", int(m.group(1)), m.group(2))
    return None


def quoted(text: str) -> list[str]:
    """The double-quoted strings of an instruction (the values a task asks to type)."""
    return _QUOTED.findall(text or "")


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
        mw = env_cfg.miniwob
        return cls(
            max_steps=env_cfg.max_steps,
            max_elements=mw.max_elements,
            chrome_binary=mw.chrome_binary,
            chromedriver=mw.chromedriver,
            timeout_s=mw.timeout_s,
        )

    # -- the browser ---------------------------------------------------------------------

    def _browser(self) -> Any:
        if self._driver is not None:
            return self._driver
        os.environ.setdefault("SE_OFFLINE", "true")  # Selenium Manager must never download
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        for path in (self.chrome_binary, self.chromedriver):
            if not Path(path).exists():
                raise EnvError(
                    f"{path} not found: install chromium + chromium-driver (make system-deps)"
                )
        self._profile_dir = tempfile.mkdtemp(prefix="dreamgym-miniwob-")
        options = webdriver.ChromeOptions()
        for flag in CHROME_FLAGS:
            options.add_argument(flag)
        options.add_argument(f"--user-data-dir={self._profile_dir}")
        options.binary_location = self.chrome_binary
        try:
            driver = webdriver.Chrome(
                service=Service(executable_path=self.chromedriver), options=options
            )
            driver.set_page_load_timeout(self.timeout_s)
            driver.set_script_timeout(self.timeout_s)
        except Exception as err:
            self._kill_browser_processes()
            raise EnvError(f"cannot start headless Chromium: {err}") from err
        self._driver = driver
        return driver

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
        marker = self._profile_dir.encode()
        for proc in Path("/proc").iterdir():
            if not proc.name.isdigit():
                continue
            try:
                cmdline = (proc / "cmdline").read_bytes()
            except OSError:
                continue
            if marker in cmdline:
                with contextlib.suppress(OSError):
                    os.kill(int(proc.name), signal.SIGKILL)
        shutil.rmtree(self._profile_dir, ignore_errors=True)
        self._profile_dir = None

    def _discard(self) -> None:
        """Drop the browser (after a crash); the next reset starts a fresh one."""
        driver, self._driver = self._driver, None
        self._done = True
        if driver is not None:
            pid = None
            with contextlib.suppress(Exception):
                pid = driver.service.process.pid
            with contextlib.suppress(Exception):
                driver.quit()
            if pid is not None:
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
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
        if parsed.verb == "click":
            self._perform(_mw_action(config, ActionTypes.CLICK_ELEMENT, ref=element.ref))
            return f"Clicked [{element.ref}] {element.kind}.", True
        if parsed.verb == "type":
            if element.kind not in TEXT_INPUTS:
                return (
                    f"Invalid action: [{element.ref}] is a {element.kind}, not a text field.",
                    False,
                )
            self._perform(_mw_action(config, ActionTypes.CLICK_ELEMENT, ref=element.ref))
            self._perform(_mw_action(config, ActionTypes.PRESS_KEY, key=_key_index("C-a")))
            self._perform(_mw_action(config, ActionTypes.TYPE_TEXT, text=parsed.arg))
            return f'Typed "{parsed.arg}" into [{element.ref}].', True
        if parsed.verb == "select":
            if element.kind != "select":
                return f"Invalid action: [{element.ref}] is a {element.kind}, not a select.", False
            if parsed.arg not in element.options:
                return f'Invalid action: [{element.ref}] has no option "{parsed.arg}".', False
            self._js(_SELECT_JS, element.ref, parsed.arg)
            return f'Selected "{parsed.arg}" in [{element.ref}].', True
        key = KEYS.get(parsed.arg.lower())
        if key is None:
            return f"Invalid action: unknown key {parsed.arg!r}; keys: {sorted(KEYS)}.", False
        self._perform(_mw_action(config, ActionTypes.CLICK_ELEMENT, ref=element.ref))
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
        dom = self._js("return core.getDOMInfo();")
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


def admissible_actions(
    elements: list[Element], utterance: str, limit: int = MAX_ADMISSIBLE
) -> list[str]:
    """Click every interactive element, type the instruction's quoted values into text
    fields, pick every option of selects; sorted, at most ``limit``."""
    actions: list[str] = []
    values = quoted(utterance)
    for e in elements:
        if not e.interactive:
            continue
        actions.append(f"click [{e.ref}]")
        if e.kind in TEXT_INPUTS:
            actions += [f'type [{e.ref}] "{v}"' for v in values]
            actions.append(f"press [{e.ref}] Enter")
        if e.kind == "select":
            actions += [f'select [{e.ref}] "{o}"' for o in e.options]
    return sorted(dict.fromkeys(actions))[:limit]


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


# -- scripted experts ------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpertView:
    """What a scripted expert sees: the instruction, the elements, the history, and the
    page itself for facts the state hides (collapsed tree folders, the current page)."""

    utterance: str
    elements: list[Element]
    history: list[str]
    js: Callable[..., Any]

    def find(self, kind: str | tuple[str, ...], text: str | None = None) -> Element | None:
        """The first element of a kind (with this exact text)."""
        kinds = (kind,) if isinstance(kind, str) else kind
        return next(
            (e for e in self.elements if e.kind in kinds and (text is None or e.text == text)),
            None,
        )

    def button(self, *names: str) -> Element | None:
        """A button by its (case-insensitive) label."""
        wanted = {n.lower() for n in names}
        return next(
            (e for e in self.elements if e.kind == "button" and e.text.lower() in wanted), None
        )


def _type(e: Element, value: str) -> str:
    return f'type [{e.ref}] "{value}"'


def _click(e: Element | None) -> str | None:
    return f"click [{e.ref}]" if e is not None else None


def _fill_then_submit(view: ExpertView, values: list[str], submit: tuple[str, ...]) -> str | None:
    fields = [e for e in view.elements if e.kind in TEXT_INPUTS]
    for field, value in zip(fields, values, strict=False):
        if field.value != value:
            return _type(field, value)
    return _click(view.button(*submit))


def _expert_enter_text(view: ExpertView) -> str | None:
    return _fill_then_submit(view, quoted(view.utterance)[:1], ("submit",))


def _expert_enter_password(view: ExpertView) -> str | None:
    value = quoted(view.utterance)[:1] * 2
    return _fill_then_submit(view, value, ("submit",))


def _expert_login_user(view: ExpertView) -> str | None:
    return _fill_then_submit(view, quoted(view.utterance)[:2], ("login",))


def _expert_click_button_sequence(view: ExpertView) -> str | None:
    names = re.findall(r"button (\w+)", view.utterance)
    for name in names:
        button = view.button(name)
        if button is not None and f"click [{button.ref}]" not in view.history:
            return _click(button)
    return None


def _expert_click_checkboxes(view: ExpertView) -> str | None:
    m = re.search(r"Select (.*?) and click Submit", view.utterance)
    wanted = (
        set() if not m or m.group(1) == "nothing" else {w.strip() for w in m.group(1).split(",")}
    )
    for box in (e for e in view.elements if e.kind == "checkbox"):
        if box.checked != (box.text in wanted):
            return _click(box)
    return _click(view.button("submit"))


def _expert_click_option(view: ExpertView) -> str | None:
    m = re.search(r"Select (.*?) and click Submit", view.utterance)
    radio = view.find("radio", m.group(1).strip()) if m else None
    if radio is not None and not radio.checked:
        return _click(radio)
    return _click(view.button("submit"))


def _expert_choose_list(view: ExpertView) -> str | None:
    m = re.search(r"Select (.*) from the list", view.utterance)
    select = view.find("select")
    if m and select is not None and select.value != m.group(1):
        return f'select [{select.ref}] "{m.group(1)}"'
    return _click(view.button("submit"))


_TREE_PATH_JS = """
var name = arguments[0];
var spans = Array.from(document.querySelectorAll('#tree span')).filter(function (s) {
  return s.textContent === name; });
for (var k = 0; k < spans.length; k++) {
  var li = spans[k].parentElement.parentElement.closest('li'), collapsed = [];
  while (li) {
    if (li.classList.contains('expandable'))
      collapsed.push(li.querySelector(':scope > span').textContent);
    li = li.parentElement.closest('li');
  }
  return collapsed.reverse();
}
return null;
"""


def _expert_navigate_tree(view: ExpertView) -> str | None:
    names = quoted(view.utterance)
    if not names:
        return None
    target = next(
        (e for e in view.elements if e.kind in ("folder", "file") and e.text == names[0]), None
    )
    if target is not None:
        return _click(target)
    collapsed = view.js(_TREE_PATH_JS, names[0]) or []
    for folder in collapsed:  # open the outermost closed folder on the way
        toggle = view.find("toggle", f"{folder} (collapsed)")
        if toggle is not None:
            return _click(toggle)
    return None


def _expert_search_engine(view: ExpertView) -> str | None:
    names = quoted(view.utterance)
    m = re.search(r"click the (\d+)\w* search result", view.utterance)
    box = view.find("textbox")
    if not names or not m or box is None:
        return None
    if box.value != names[0]:
        return _type(box, names[0])
    results = [e for e in view.elements if e.kind == "link" and "search-title" in e.classes]
    index = int(m.group(1)) - 1
    page = index // 3 + 1
    active = view.js(
        "var a = document.querySelector('#pagination li.active');"
        "return a ? a.textContent.trim() : null;"
    )
    if not results or active is None:
        return _click(view.button("search"))
    if str(active) != str(page):
        return _click(view.find("link", str(page)))
    return _click(results[index % 3]) if index % 3 < len(results) else None


def _expert_use_autocomplete(view: ExpertView) -> str | None:
    values = quoted(view.utterance)
    box = view.find("textbox")
    if not values or box is None:
        return None
    start, end = values[0], values[1] if len(values) > 1 else ""
    value = box.value or ""
    if value.startswith(start) and value.endswith(end) and value != start:
        return _click(view.button("submit"))
    for option in (e for e in view.elements if e.kind == "option"):
        if option.text.startswith(start) and option.text.endswith(end):
            return _click(option)
    if value != start:
        return _type(box, start)
    # no menu entry fits: type a whole item of the page's own list
    item = view.js(
        "var s = arguments[0], e = arguments[1];"
        "return (ui_utils.COUNTRIES || []).find(function (c) {"
        " return c.startsWith(s) && c.endsWith(e); }) || null;",
        start,
        end,
    )
    return _type(box, str(item)) if item else None


ExpertFn = Callable[[ExpertView], "str | None"]
EXPERTS: dict[str, ExpertFn] = {
    "click-button-sequence": _expert_click_button_sequence,
    "enter-text": _expert_enter_text,
    "enter-password": _expert_enter_password,
    "login-user": _expert_login_user,
    "click-checkboxes": _expert_click_checkboxes,
    "click-option": _expert_click_option,
    "choose-list": _expert_choose_list,
    "navigate-tree": _expert_navigate_tree,
    "search-engine": _expert_search_engine,
    "use-autocomplete": _expert_use_autocomplete,
    "use-autocomplete-nodelay": _expert_use_autocomplete,
}
