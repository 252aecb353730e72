"""Scripted MiniWoB experts: the collection policy's next action, one per supported task.

An expert sees an ``ExpertView`` (instruction, elements, history, the page's JS) and
returns its next text action, or None where it has none.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from components.envs.miniwob_dom import TEXT_INPUTS, Element, quoted


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
