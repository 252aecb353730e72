"""MiniWoB's DOM info as the abstract state's elements, and the text actions over them.

Pure functions (no browser): ``extract_elements`` picks the relevant elements of the task
area from ``core.getDOMInfo()``, ``render_state`` renders them as ``[id] type: text``
lines, ``parse_action`` parses a text action strictly and ``admissible_actions`` lists the
actions offered in a state.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from components.envs.episodic import collapse

MAX_TEXT = 60  # characters of an element's text shown in the state
MAX_ADMISSIBLE = 40

_CLICK = re.compile(r"^click \[(-?\d+)\]$")
_TEXT_ARG = re.compile(r'^(type|select) \[(-?\d+)\] "(.*)"$', re.DOTALL)
_PRESS = re.compile(r"^press \[(-?\d+)\] ([A-Za-z]+)$")
_QUOTED = re.compile(r'"([^"]+)"')
_LINE = re.compile(r"^\[(-?\d+)\] ([\w-]+): ?(.*)$")
_FIELD = re.compile(r'^(.*?)\s*"(.*)"$')
_TOGGLE = re.compile(r"^(.*) \((checked|unchecked)\)$")
_SELECT = re.compile(r'^"(.*)" \(options: (.*)\)$')

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
# controls drawn as empty spans (an icon by CSS): named by their class or id. The record
# they act on (an email's sender, a post's @user) is added to the name, or ten "star"s
# would read the same
_ICON_CLASSES = {"trash", "star", "reply", "retweet", "like", "more"}
_ICON_IDS = {
    "close-email": "close",
    "open-search": "search",
    "close-reply": "close",
    "send-reply": "send",
    "close-forward": "close",
    "send-forward": "send",
}
_BUTTON_CLASSES = {"email-reply", "email-forward"}  # a span with an icon and a word


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

    def visit(
        node: dict[str, Any], parent: dict[str, Any] | None, in_area: bool, owner: str = ""
    ) -> None:
        if node.get("id") in _SKIP_IDS:
            return
        tag = str(node.get("tag", "")).lower()
        classes = str(node.get("classes") or "")
        words = classes.split()
        # a jQuery UI dialog is placed outside the task area, at the end of <body>
        in_area = in_area or node.get("id") == "area" or "ui-dialog" in words
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
        if in_area and tag == "span" and "alink" in classes.split():  # a link styled as text
            interactive.append(Element(ref, "link", text, classes=classes))
            return
        if in_area and tag == "span" and ("folder" in classes or "file" in classes):
            kind = "folder" if "folder" in classes else "file"
            interactive.append(Element(ref, kind, text, classes=classes))
            return
        if tag == "li" and "ui-menu-item" in classes:  # jQuery UI autocomplete / menus
            interactive.append(Element(ref, "option", text, classes=classes))
            return
        children = node.get("children", [])
        if in_area and _widget(node, tag, words, text, owner, children, interactive):
            return
        if in_area and "media" in words:  # a post: its controls act on its @user
            owner = _text_of(_first(node, "username") or {})
        if in_area and not children and text and tag not in ("label",) and ref > 0:
            static.append(Element(ref, "text", text, classes=classes, interactive=False))
            return
        if in_area and not children and text and tag == "t":
            static.append(Element(ref, "text", text, classes=classes, interactive=False))
            return
        for child in children:
            visit(child, node, in_area, owner)

    visit(root, None, False)
    # label elements of inputs are already shown with their input
    labels = {e.text for e in interactive if e.kind in (*TEXT_INPUTS, "checkbox", "radio")}
    static = [e for e in static if e.text not in labels]
    return (interactive + static)[:limit]


def _widget(
    node: dict[str, Any],
    tag: str,
    words: list[str],
    text: str,
    owner: str,
    children: list[dict[str, Any]],
    interactive: list[Element],
) -> bool:
    """The task widgets read from their class or id (True: ``node`` is done): jQuery UI
    accordion headers, the email inbox's rows and icons, the social feed's controls and
    menus. Their controls are clickable ``div``/``span``s, static text to the rules above."""
    ref = int(node.get("ref", 0))
    classes = " ".join(words)
    if "ui-accordion-header" in words:
        interactive.append(Element(ref, "section", text, classes=classes))
        return True
    if "email-thread" in words:
        # one row per email, its sender and subject; its trash and star icons are left
        # to the opened email (which has them too), so ten emails fit the state
        sender = _text_of(_first(node, "email-sender") or {})
        subject = _text_of(_first(node, "email-subject") or {})
        interactive.append(
            Element(ref, "email", f"{sender}: {subject}"[:MAX_TEXT], classes=classes)
        )
        return True
    icon = next((w for w in words if w in _ICON_CLASSES), None) or _ICON_IDS.get(
        str(node.get("id") or "")
    )
    if icon is not None and not text:
        name = f"{icon} ({owner})" if owner else icon
        interactive.append(Element(ref, "icon", name, classes=classes))
        return True
    if tag == "span" and any(w in _BUTTON_CLASSES for w in words):
        interactive.append(Element(ref, "button", text, classes=classes))
        return True
    if tag == "ul" and owner:  # the menu a post's "more" opens
        for item in children:
            if str(item.get("tag", "")).lower() == "li":
                label = _text_of(item)[:MAX_TEXT]
                interactive.append(Element(int(item.get("ref", 0)), "option", label))
        return True
    return False


def _first(node: dict[str, Any], cls: str) -> dict[str, Any] | None:
    """The first descendant of ``node`` with class ``cls``, depth first."""
    for child in node.get("children", []):
        if cls in str(child.get("classes") or "").split():
            return child
        found = _first(child, cls)
        if found is not None:
            return found
    return None


def render_state(elements: list[Element], feedback: str) -> str:
    """The abstract state: one ``[id] type: text`` line per element, then the feedback."""
    lines = [e.render() for e in elements] or ["(no elements)"]
    return "\n".join([*lines, f"Feedback: {feedback}"])


@lru_cache(maxsize=1 << 14)
def parse_page(state: str) -> tuple[Element, ...] | None:
    """The elements of a rendered state (inverse of ``render_state``; static elements
    come back as interactive), or None when ``state`` is not one."""
    lines = [ln for ln in state.splitlines() if ln and not ln.startswith("Feedback: ")]
    if not lines:
        return None
    if lines == ["(no elements)"]:
        return ()
    out = []
    for ln in lines:
        m = _LINE.match(ln)
        if m is None:
            return None
        ref, kind, body = int(m.group(1)), m.group(2), m.group(3)
        out.append(_element(ref, kind, body))
    return tuple(out)


def _element(ref: int, kind: str, body: str) -> Element:
    if kind in TEXT_INPUTS and (m := _FIELD.match(body)):
        return Element(ref, kind, m.group(1), m.group(2))
    if kind in ("checkbox", "radio") and (m := _TOGGLE.match(body)):
        return Element(ref, kind, m.group(1), "true" if m.group(2) == "checked" else "false")
    if kind == "select" and (m := _SELECT.match(body)):
        return Element(ref, kind, "", m.group(1), tuple(m.group(2).split(" | ")))
    return Element(ref, kind, body)


def clickable(ref: int) -> bool:
    """Whether MiniWoB can click ``ref``: a text node's (negative) ref is no element."""
    return ref > 0


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


AS_ASKED = " as asked"  # describe_commands' mark of a value typed into its own field


def quoted(text: str) -> list[str]:
    """The double-quoted strings of an instruction (the values a task asks to type)."""
    return _QUOTED.findall(text or "")


def admissible_actions(
    elements: list[Element], utterance: str, limit: int = MAX_ADMISSIBLE
) -> list[str]:
    """Click every interactive element, type the instruction's quoted values into text
    fields, pick every option of selects; sorted, at most ``limit``. Past the limit the
    instruction's own inputs (typing, Enter, options it names) are kept before clicks, and
    clicks before other options: a plain sorted cut kept only clicks on a crowded page."""
    named: list[str] = []  # what the instruction asks for: never crowded out
    clicks: list[str] = []
    options: list[str] = []
    values = quoted(utterance)
    for e in elements:
        if not e.interactive:
            continue
        clicks.append(f"click [{e.ref}]")
        if e.kind in TEXT_INPUTS:
            named += [f'type [{e.ref}] "{v}"' for v in values]
            named.append(f"press [{e.ref}] Enter")
        if e.kind == "select":
            for o in e.options:
                asked = o.strip() and o.strip().lower() in utterance.lower()
                (named if asked else options).append(f'select [{e.ref}] "{o}"')
    kept: dict[str, None] = {}
    for group in (named, clicks, options):
        for action in sorted(group):
            if len(kept) >= limit:
                break
            kept.setdefault(action, None)
    return sorted(kept)


def describe_commands(
    state: str, commands: Sequence[str], instruction: str = ""
) -> list[str] | None:
    """Each command with what it acts on (``click [10]`` -> ``click [10] radio: pC
    (unchecked)``): what a policy must read to tell two clicks apart. A field shows its
    label, not its value, and a select no options: every option named in each ``select``
    command would make them all look like the one the instruction names. Typing the value
    the instruction names right after the field's label ("the username \"annis\"") is
    marked ``as asked``: which value goes in which field is word order, which a bag of
    words cannot see. None when ``state`` is not a page."""
    page = parse_page(state)
    if page is None:
        return None
    by_ref = {e.ref: e for e in page}
    said = " ".join(instruction.lower().split())
    out = []
    for c in commands:
        parsed = parse_action(c)
        e = by_ref.get(parsed.ref) if parsed is not None else None
        if e is None:
            out.append(c)
            continue
        text = f"{c} {_described(e)}"
        noun = e.text.lower().split()[-1] if e.text else ""  # "Verify password": password
        if parsed.verb == "type" and noun and f'{noun} "{parsed.arg.lower()}"' in said:
            text += AS_ASKED
        out.append(text)
    return out


def _described(e: Element) -> str:
    if e.kind in ("checkbox", "radio"):
        return f"{e.kind}: {e.text} ({'checked' if e.checked else 'unchecked'})"
    if e.kind == "select":
        return e.kind
    return f"{e.kind}: {e.text}".rstrip(": ")
