"""MiniWoB++'s text actions over a page's elements (pure functions, no browser)."""

from __future__ import annotations

from typing import Any

from components.envs.miniwob_dom import (
    Element,
    admissible_actions,
    extract_elements,
    parse_page,
    render_state,
)

_REF = iter(range(1, 10_000))


def _n(tag: str, *children: dict[str, Any], text: str = "", cls: str = "", id: str = "") -> dict:
    """A node as MiniWoB's ``core.getDOMInfo`` gives it."""
    return {
        "tag": tag,
        "ref": next(_REF),
        "text": text,
        "classes": cls,
        "id": id,
        "children": list(children),
    }


def _page(*area: dict[str, Any], outside: tuple[dict[str, Any], ...] = ()) -> dict:
    return _n("BODY", _n("DIV", _n("DIV", *area, id="area"), id="wrap"), *outside)


def _shown(root: dict[str, Any], limit: int = 20) -> list[tuple[str, str, bool]]:
    return [(e.kind, e.text, e.interactive) for e in extract_elements(root, {}, limit)]


def test_a_crowded_page_keeps_the_instructions_inputs_before_clicks() -> None:
    buttons = [Element(i, "button", f"b{i}") for i in range(1, 50)]
    field = Element(60, "textbox", "Username", "")
    select = Element(61, "select", "", "", tuple(f"opt{i}" for i in range(30)))
    actions = admissible_actions([*buttons, field, select], 'Enter "annis" and pick opt7.')
    assert len(actions) == 40
    assert actions == sorted(actions)
    # a plain sorted cut kept only the 40 first clicks
    assert {'type [60] "annis"', "press [60] Enter", 'select [61] "opt7"'} <= set(actions)
    assert 'select [61] "opt8"' not in actions  # clicks come before options it does not name


def test_a_page_under_the_limit_offers_every_action_sorted() -> None:
    elements = [Element(2, "button", "Submit"), Element(1, "textbox", "Name", "")]
    actions = admissible_actions(elements, 'Type "bo".')
    assert actions == ["click [1]", "click [2]", "press [1] Enter", 'type [1] "bo"']


def test_a_dialog_outside_the_task_area_is_read() -> None:
    # jQuery UI appends the dialog to <body>, after the (empty) task area
    close = _n("BUTTON", _n("SPAN", cls="ui-icon"), _n("t", text="Close"), cls="ui-button")
    dialog = _n(
        "DIV",
        _n("DIV", _n("SPAN", cls="ui-dialog-title"), close, cls="ui-dialog-titlebar"),
        _n("DIV", _n("P", text="Lorem ipsum."), id="dialog"),
        _n("DIV", _n("BUTTON", text="OK", cls="ui-button")),
        cls="ui-dialog ui-widget",
    )
    outside = _n("DIV", _n("BUTTON", text="Elsewhere"))  # not a dialog: still left out
    assert _shown(_page(outside=(dialog, outside))) == [
        ("button", "Close", True),
        ("button", "OK", True),
        ("text", "Lorem ipsum.", False),
    ]


def test_accordion_headers_are_sections_to_click() -> None:
    header = _n("H3", _n("t", text="Section #1"), cls="ui-accordion-header ui-state-default")
    assert _shown(_page(header)) == [("section", "Section #1", True)]


def _email(sender: str, subject: str) -> dict[str, Any]:
    return _n(
        "DIV",
        _n(
            "DIV",
            _n("DIV", text=sender, cls="email-sender"),
            _n("DIV", text=subject, cls="email-subject"),
            _n("DIV", text="Body..", cls="email-body"),
            cls="email-left",
        ),
        _n("DIV", _n("DIV", _n("SPAN", cls="trash"), _n("SPAN", cls="star"), cls="email-actions")),
        cls="email-thread",
    )


def test_an_inbox_is_one_row_per_email_and_an_open_email_has_its_icons() -> None:
    inbox = _page(_n("DIV", *(_email(f"S{i}", f"Subj {i}") for i in range(12)), id="main"))
    rows = _shown(inbox)
    # ten emails and more fit the 20 lines: the rows' own icons are left to the open email
    assert rows == [("email", f"S{i}: Subj {i}", True) for i in range(12)]
    opened = _page(
        _n(
            "DIV",
            _n(
                "DIV",
                _n("SPAN", id="close-email"),
                _n("DIV", _n("SPAN", cls="trash"), _n("SPAN", cls="star"), cls="email-actions"),
                id="email-bar",
            ),
            _n("SPAN", _n("DIV", cls="icon"), _n("DIV", text="Reply"), cls="email-reply"),
            id="email",
        )
    )
    assert _shown(opened) == [
        ("icon", "close", True),
        ("icon", "trash", True),
        ("icon", "star", True),
        ("button", "Reply", True),
    ]


def test_a_posts_controls_and_menu_name_its_user() -> None:
    def post(user: str, menu: bool) -> dict[str, Any]:
        more = [_n("SPAN", cls="more")]
        if menu:
            more.append(_n("UL", _n("LI", text=f"Mute {user}", cls="menu-user")))
        return _n(
            "DIV",
            _n(
                "DIV",
                _n("SPAN", text="Name", cls="name"),
                _n("SPAN", text=user, cls="username"),
                cls="details",
            ),
            _n(
                "DIV",
                _n("SPAN", cls="reply"),
                _n("SPAN", cls="like"),
                _n("SPAN", *more),
                cls="controls",
            ),
            cls="media",
        )

    shown = _shown(_page(post("@ann", False), post("@bo", True)), limit=9)
    assert shown[:7] == [
        ("icon", "reply (@ann)", True),
        ("icon", "like (@ann)", True),
        ("icon", "more (@ann)", True),
        ("icon", "reply (@bo)", True),
        ("icon", "like (@bo)", True),
        ("icon", "more (@bo)", True),
        ("option", "Mute @bo", True),
    ]
    assert shown[7:] == [("text", "Name", False), ("text", "@ann", False)]
    # the dream reads the rendered state back: the widgets' kinds and names survive
    elements = extract_elements(_page(post("@ann", False), post("@bo", True)), {}, 9)
    back = parse_page(render_state(elements, "ok"))
    assert [(e.ref, e.kind, e.text) for e in back] == [(e.ref, e.kind, e.text) for e in elements]
