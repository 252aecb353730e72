"""Web-page states (MiniWoB++) as the grounded model reads, edits and judges them.

A page state is one ``[id] kind: text`` line per element, then the feedback
(components/envs/miniwob_dom.py renders it). Unlike a TextWorld room, what an action does
to a page is local and visible: typing sets a field's value, selecting sets a select's,
clicking a checkbox toggles it and clicking a radio checks it (and clears the others).
``page_edit`` applies that; the feedback sentence is learned from real transitions as a
template per (verb, element kind, valid), like the TextWorld verbs' templates.

Whether a submit wins depends on the page's values against the instruction, not on the
command's words, so ``page_features`` measures that: which of the instruction's targets
(its quoted strings, and its words that name an option or a checkbox/radio) the page
holds, which held values the instruction does not ask for, and what the command clicks.
The won/lost classifiers of a page env see these beside ``outcome_features``.
"""

from __future__ import annotations

import random
import re
from collections import Counter, defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from functools import lru_cache, partial

from components.envs.miniwob_dom import (
    TEXT_INPUTS,
    Element,
    clickable,
    parse_action,
    parse_page,
    quoted,
)

_WORD = re.compile(r"[\w'-]+")
_OVER = re.compile(r"\s*The episode is over: \w+\.$")
FEEDBACK = "Feedback: "
CLICKABLE = (
    *("button", "link", "file", "folder", "span", "div", "option", "toggle"),
    *("icon", "email", "section"),  # miniwob_dom's widgets (inbox, feed, accordion)
)
# what a click lands on, grouped by what it tends to do (submit, open, expand, set)
CLICK_GROUPS = (
    ("button", "icon"),
    ("link", "file", "span", "div", "option", "email"),
    ("folder", "toggle", "section"),
)
# kinds whose label a generated instruction may name instead (same page, another target)
_SWAP_KINDS = ("checkbox", "radio", "file", "folder")
# a link that turns pages of a list (search results) rather than choosing an entry of it
_PAGER = re.compile(r"(?:\d+|[<>\u00ab\u00bb]|prev(?:ious)?|next|first|last)", re.IGNORECASE)
PAGE_FEATURES = 14 + len(CLICK_GROUPS)  # len(page_features(...))
# what a click on an element of some kind does to the rest of the page, learned per kind:
# nothing, or "fill" (the entry's text goes into the page's text field and its list closes)
CLICK_OPS = ("none", "fill")
_VALUE_KINDS = (*TEXT_INPUTS, "select", "checkbox", "radio")


def render_page(elements: Sequence[Element], feedback: str) -> str:
    """The page state text of ``elements`` (miniwob_dom's ``render_state``)."""
    lines = [e.render() for e in elements] or ["(no elements)"]
    return "\n".join([*lines, f"{FEEDBACK}{feedback}"])


@lru_cache(maxsize=1 << 14)
def page_edit(state: str, action: str) -> tuple[tuple[Element, ...], str, str, bool] | None:
    """(elements after ``action``, verb, element kind, valid), or None if not a page state."""
    page = parse_page(state)
    if page is None:
        return None
    parsed = parse_action(action)
    if parsed is None:
        return page, action.strip().split(" ", 1)[0].lower(), "", False
    target = next((e for e in page if e.ref == parsed.ref), None)
    if target is None:
        return page, parsed.verb, "", False
    kind = target.kind
    if parsed.verb == "type" and kind in TEXT_INPUTS:
        return _set(page, target, value=parsed.arg), parsed.verb, kind, True
    if parsed.verb == "select" and kind == "select" and parsed.arg in target.options:
        return _set(page, target, value=parsed.arg), parsed.verb, kind, True
    if parsed.verb == "click" and kind == "checkbox":
        flipped = "false" if target.checked else "true"
        return _set(page, target, value=flipped), parsed.verb, kind, True
    if parsed.verb == "click" and kind == "radio":
        out = tuple(replace(e, value="false") if e.kind == "radio" else e for e in page)
        return _set(out, target, value="true"), parsed.verb, kind, True
    valid = parsed.verb in ("click", "press") and clickable(target.ref)
    return page, parsed.verb, kind, valid


def _set(page: Sequence[Element], target: Element, value: str) -> tuple[Element, ...]:
    return tuple(replace(e, value=value) if e.ref == target.ref else e for e in page)


def click_op(op: str, page: Sequence[Element], ref: int) -> tuple[Element, ...]:
    """The page after a click on ``ref`` does ``op`` (one of ``CLICK_OPS``) to it."""
    target = next((e for e in page if e.ref == ref), None)
    fields = [e for e in page if e.kind in TEXT_INPUTS]
    if op != "fill" or target is None or len(fields) != 1:
        return tuple(page)
    return tuple(e for e in _set(page, fields[0], target.text) if e.kind != target.kind)


def page_commands(state: str, current: Sequence[str]) -> tuple[str, ...]:
    """``current``'s commands on elements the page ``state`` still shows (a click op
    closes a list: its entries' clicks go), or all of them if none is."""
    refs = {e.ref for e in parse_page(state) or ()}
    kept = tuple(c for c in current if (p := parse_action(c)) is None or p.ref in refs)
    return kept or tuple(current)


def _shown(page: Sequence[Element]) -> tuple[tuple[str, str, str, tuple[str, ...]], ...]:
    return tuple((e.kind, e.text, e.value or "", e.options) for e in page)


def click_keys(state: str, action: str) -> tuple[tuple, tuple] | None:
    """Id-free keys of a click: (the page as shown, which element) and (the page's values,
    the element's kind and text); None unless ``action`` clicks an element of the page."""
    page = parse_page(state)
    parsed = parse_action(action)
    if page is None or parsed is None or parsed.verb != "click":
        return None
    at = next((i for i, e in enumerate(page) if e.ref == parsed.ref), None)
    if at is None:
        return None
    shown = _shown(page)
    values = tuple(x for x in shown if x[0] in _VALUE_KINDS)
    return (shown, at), (values, page[at].kind, page[at].text)


@dataclass
class PageClicks:
    """Recorded clicks of a game, keyed without element ids (a page re-rendered renumbers
    them): where the page as shown is new, what the same click did under the same field
    values, if every recording of it shows the same page (a search button; a results
    page's number)."""

    shown: dict[tuple, Counter] = field(default_factory=lambda: defaultdict(Counter))
    valued: dict[tuple, Counter] = field(default_factory=lambda: defaultdict(Counter))

    def add(self, game: str, state: str, action: str, next_state: str, ending: tuple) -> None:
        """Record a real click: the next page (its feedback as a template) and its ending."""
        keys = click_keys(state, action)
        if keys is None:
            return
        body, _, feedback = next_state.rpartition(FEEDBACK)
        kind = keys[1][1]
        outcome = (body.rstrip("\n"), page_template(feedback, action, kind), *ending)
        self.shown[(game, *keys[0])][outcome] += 1
        self.valued[(game, *keys[1])][outcome] += 1

    def lookup(self, game: str, state: str, action: str) -> tuple[str, str, tuple | None] | None:
        """(next page without feedback, feedback template, the ending if every recording
        agrees on it), or None where no recording of the click decides the page."""
        keys = click_keys(state, action)
        if keys is None:
            return None
        outcomes = self.shown.get((game, *keys[0]))
        if not outcomes:
            outcomes = self.valued.get((game, *keys[1]))
            pages = {_shown(parse_page(o[0]) or ()) for o in outcomes or ()}
            if len(pages) != 1:
                return None
        # a finished episode's recorded page is the next episode's: the page of a click
        # that went on, where one was recorded
        going = Counter({o: n for o, n in outcomes.items() if not any(o[2:])}) or outcomes
        body, template, *_ = going.most_common(1)[0][0]
        endings = {tuple(o[2:]) for o in outcomes}
        return body, template, endings.pop() if len(endings) == 1 else None


def page_template(feedback: str, action: str, kind: str) -> str:
    """The feedback with the element id, the typed text and the kind as placeholders."""
    parsed = parse_action(action)
    out = _OVER.sub("", feedback)
    if parsed is not None:
        out = out.replace(f"[{parsed.ref}]", "[{ID}]")
        if parsed.arg:
            out = out.replace(parsed.arg, "{ARG}")
    return out.replace(kind, "{KIND}") if kind else out


def fill_page_template(template: str, action: str, kind: str) -> str | None:
    """``template`` filled from ``action`` and ``kind``; None when it needs what they lack."""
    parsed = parse_action(action)
    if "{ID}" in template and parsed is None:
        return None
    if "{ARG}" in template and (parsed is None or not parsed.arg):
        return None
    if "{KIND}" in template and not kind:
        return None
    if parsed is not None:
        template = template.replace("{ID}", str(parsed.ref)).replace("{ARG}", parsed.arg)
    return template.replace("{KIND}", kind)


def _targets(instruction: str, page: Sequence[Element]) -> tuple[set[str], list[str]]:
    """(value targets, click targets in the order the instruction names them) on this page."""
    values = set(quoted(instruction))
    named = _WORD.findall(instruction) + quoted(instruction)
    words = set(named)
    labels: set[str] = set()
    for e in page:
        if e.kind in ("checkbox", "radio") and e.text in words:
            values.add(e.text)
        elif e.kind == "select":
            values |= {o for o in e.options if o in words}
        elif e.kind not in TEXT_INPUTS and e.text in words:
            labels.add(e.text)
    return values, list(dict.fromkeys(w for w in named if w in labels))


def _clicked(page: Sequence[Element], action: str) -> Element | None:
    parsed = parse_action(action)
    if parsed is None or parsed.verb != "click":
        return None
    return next((e for e in page if e.ref == parsed.ref), None)


def last_click(history: Sequence[str]) -> str:
    """The episode's latest click (a page's buttons keep no visible trace of it)."""
    return next((a for a in reversed(history) if a.lower().startswith("click ")), "")


def page_features(instruction: str, state: str, action: str, previous: str = "") -> list[float]:
    """How the page after ``action`` meets the instruction, and what ``action`` clicks.

    ``previous`` is the episode's previous click (``last_click``: an ordered "click A, then
    B" is met when A was clicked just before; a second click ends such a page either way).
    All zeros when ``state`` is not a page.
    """
    edited = page_edit(state, action)
    if edited is None:
        return [0.0] * PAGE_FEATURES
    before = parse_page(state) or ()
    page, verb, kind, valid = edited
    values, clicks = _targets(instruction, before)
    held = [e.value or "" for e in page if e.kind in (*TEXT_INPUTS, "select")]
    held += [e.text for e in page if e.kind in ("checkbox", "radio") and e.checked]
    held = [h for h in held if h]
    met = sum(any(v == h or (len(v) > 1 and v in h) for h in held) for v in values)
    met_share = met / len(values) if values else 1.0
    extra = sum(not any(v == h or (len(v) > 1 and v in h) for v in values) for h in held)
    extra_share = extra / max(1, len(held))
    fields = [e for e in page if e.kind in TEXT_INPUTS]
    empty = sum(not e.value for e in fields) / len(fields) if fields else 0.0
    clicked = _clicked(before, action)
    submits = float(verb == "click" and valid and kind in CLICKABLE)
    on_target = float(submits and clicked is not None and clicked.text in clicks)
    done = float(met_share == 1.0 and extra == 0)
    last = _clicked(before, previous)
    # a list entry the instruction does not name ends a search for real (MiniWoB++ scores
    # the click); a page control does not: one "link" kind to the click groups, so apart
    pager = clicked is not None and clicked.kind == "link" and _PAGER.fullmatch(clicked.text)
    off_entry = clicked is not None and clicked.kind == "link" and not pager and not on_target
    in_order = float(
        len(clicks) > 1
        and clicked is not None
        and clicked.text == clicks[-1]
        and last is not None
        and last.text == clicks[-2]
    )
    return [
        1.0,
        met_share,
        extra_share,
        empty,
        done,
        submits,
        on_target,
        done * submits,
        done * on_target,
        float(not values) * submits,
        in_order,
        float(bool(pager)),
        float(off_entry),
        float(submits and last is not None),
        *(float(clicked is not None and clicked.kind in group) for group in CLICK_GROUPS),
    ]


def page_variants(instruction: str, state: str, rng: random.Random, n: int) -> list[str]:
    """Up to ``n`` instructions for the same page with another target: an option, a
    checkbox/radio or a file of the page the instruction does not name, in place of one
    it names. Typed values stay (the page's commands type only the original ones)."""
    page = parse_page(state) or ()
    values, clicks = _targets(instruction, page)
    swappable = [
        (e.kind, t)
        for e in page
        for t in ([e.text] if e.kind != "select" else e.options)
        if (t in values or t in clicks)
        and (e.kind != "select" or t in values)
        and e.kind in (*_SWAP_KINDS, "select")
    ]
    named = set(values) | set(clicks)
    options: list[str] = []
    for kind, old in dict.fromkeys(swappable):
        pool = [
            t
            for e in page
            if e.kind == kind
            for t in ([e.text] if kind != "select" else e.options)
            if t and t not in named and t != old
        ]
        pattern = re.compile(rf'(?<![\w"]){re.escape(old)}(?![\w"])|"{re.escape(old)}"')
        for new in dict.fromkeys(pool):
            text = pattern.sub(partial(_swap, new), instruction, count=1)
            if text != instruction:
                options.append(text)
    rng.shuffle(options)
    return options[:n]


def _swap(new: str, match: re.Match[str]) -> str:
    return f'"{new}"' if match.group(0).startswith('"') else new
