"""MiniWoB++'s text actions over a page's elements (pure functions, no browser)."""

from __future__ import annotations

from components.envs.miniwob_dom import Element, admissible_actions


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
