"""The grounded model on web pages (MiniWoB++ states), on a hand-made radio-button page.

``_Page`` plays a click-option task the way components/envs/miniwob_env.py renders it:
radios with random labels and a Submit button; the task is won when the named radio is
checked at submit. The model is fitted on some pages and asked about unseen ones.
"""

from __future__ import annotations

import random

import numpy as np
import pytest

from components.agent.features import command_scalars
from components.envs.miniwob_dom import (
    Element,
    describe_commands,
    parse_page,
    render_state,
)
from components.experience.grounded import GroundedModel, GroundedSettings, Query
from components.experience.grounded_drafts import EDIT
from components.experience.grounded_page import (
    PAGE_FEATURES,
    fill_page_template,
    last_click,
    page_edit,
    page_features,
    page_template,
    page_variants,
)
from components.memory import VERBS, EpisodeMemory
from components.schema import Trajectory
from tests.factories import make_step, make_task, trajectory_of

LOADED = "The page is loaded."


class _Page:
    """Page ``p``: four radios with made-up labels, the target among them, and Submit."""

    def __init__(self, p: int) -> None:
        rng = random.Random(p)
        self.labels = ["".join(rng.choices("abcdefghkmnpqrstuvwxyz", k=5)) for _ in range(4)]
        self.target = self.labels[p % 4]
        self.checked: str | None = None
        self.task_id = f"mw-click-option-train-{p}"

    def instruction(self) -> str:
        return f"Select {self.target} and click Submit."

    def elements(self) -> list[Element]:
        radios = [
            Element(2 * i + 4, "radio", x, "true" if x == self.checked else "false")
            for i, x in enumerate(self.labels)
        ]
        return [*radios, Element(12, "button", "Submit")]

    def state(self, feedback: str = LOADED) -> str:
        return render_state(self.elements(), feedback)

    def admissible(self) -> list[str]:
        return sorted(f"click [{e.ref}]" for e in self.elements())

    def click(self, label: str) -> str:
        return f"click [{next(e.ref for e in self.elements() if e.text == label)}]"

    def play(self, picks: list[str], n: int) -> Trajectory:
        """Click each radio of ``picks``, then Submit."""
        steps, last = [], LOADED
        for i, action in enumerate([*(self.click(x) for x in picks), "click [12]"]):
            before, adm = self.state(last), self.admissible()
            ref = int(action[7:-1])
            kind = "button" if ref == 12 else "radio"
            feedback = f"Clicked [{ref}] {kind}."
            reward = 0
            if ref == 12:
                reward = int(self.checked == self.target)
                feedback += f" The episode is over: {'success' if reward else 'failure'}."
            else:
                self.checked = self.labels[(ref - 4) // 2]
            steps.append(
                make_step(
                    f"{self.task_id}-ep{n}",
                    i,
                    before,
                    action,
                    self.state(feedback),
                    task_id=self.task_id,
                    instruction=self.instruction(),
                    reward=reward,
                    done=ref == 12,
                    admissible_actions=adm,
                    env="miniwob",
                )
            )
            last = feedback
        return trajectory_of(steps)


def _episodes(pages: range) -> list[Trajectory]:
    out = []
    for p in pages:
        page = _Page(p)
        others = [x for x in page.labels if x != page.target]
        for n, picks in enumerate(([page.target], [others[0]], [], [others[1], page.target])):
            out.append(_Page(p).play(picks, n))
    return out


@pytest.fixture(scope="module")
def model() -> GroundedModel:
    m = GroundedModel(GroundedSettings(seed=0))
    m.fit(_episodes(range(12)))
    return m


def test_parse_page_inverts_render_for_every_kind() -> None:
    elements = [
        Element(4, "select", "", "Cuba", ("Cuba", "Chad")),
        Element(5, "textbox", "Username", "annis"),
        Element(6, "password", "", ""),
        Element(7, "checkbox", "qJ", "true"),
        Element(8, "radio", "pC", "false"),
        Element(9, "button", "Submit"),
    ]
    assert parse_page(render_state(elements, "hi")) == tuple(elements)
    assert parse_page("Location: Kitchen\nInventory: nothing\nFeedback: hi") is None


def test_page_edit_sets_values_toggles_and_checks_one_radio() -> None:
    state = render_state(
        [
            Element(4, "textbox", "", ""),
            Element(5, "checkbox", "a", "false"),
            Element(6, "radio", "x", "true"),
            Element(7, "radio", "y", "false"),
            Element(8, "select", "", "Cuba", ("Cuba", "Chad")),
            Element(9, "button", "Submit"),
            Element(10, "text", "Lorem"),
            Element(-1, "text", "ipsum"),
        ],
        LOADED,
    )

    def after(action: str) -> tuple[str, bool]:
        out = page_edit(state, action)
        assert out is not None
        page, _, _, valid = out
        return render_state(list(page), "").rsplit("\nFeedback", 1)[0], valid

    assert '[4] textbox: "hi"' in after('type [4] "hi"')[0]
    assert "[5] checkbox: a (checked)" in after("click [5]")[0]
    text, valid = after("click [7]")
    assert valid and "x (unchecked)" in text and "y (checked)" in text
    assert '"Chad"' in after('select [8] "Chad"')[0]
    assert after('select [8] "Peru"')[1] is False  # no such option
    assert after('type [9] "hi"')[1] is False  # a button is no text field
    assert after("click [99]")[1] is False
    assert after("click [10]")[1] is True  # a text element can be clicked...
    assert after("click [-1]")[1] is False  # ...a text node (MiniWoB's negative ref) not
    assert after("press [-1] Enter")[1] is False
    assert after("dance")[1] is False
    assert page_edit("Location: Hall\nFeedback: x", "click [4]") is None


def test_page_templates_round_trip_to_another_command() -> None:
    template = page_template('Typed "vV" into [10].', 'type [10] "vV"', "password")
    assert template == 'Typed "{ARG}" into [{ID}].'
    assert fill_page_template(template, 'type [7] "ab"', "textbox") == 'Typed "ab" into [7].'
    over = page_template("Clicked [5] button. The episode is over: success.", "click [5]", "button")
    assert over == "Clicked [{ID}] {KIND}."
    assert fill_page_template(template, "click [7]", "button") is None  # nothing typed


def test_page_features_tell_a_met_goal_from_a_missed_one() -> None:
    page = _Page(1)
    mem = EpisodeMemory.replay(page.instruction(), page.state())
    submit_empty = page_features(page.instruction(), page.state(), "click [12]")
    page.checked = page.target
    submit_right = page_features(page.instruction(), page.state(), "click [12]")
    page.checked = next(x for x in page.labels if x != page.target)
    submit_wrong = page_features(page.instruction(), page.state(), "click [12]")
    assert len(submit_right) == PAGE_FEATURES
    done, submits = 4, 5
    assert submit_right[done] == 1 and submit_right[submits] == 1
    assert submit_wrong[done] == 0 and submit_empty[done] == 0
    assert submit_wrong[2] == 1.0  # the one value held is not asked for
    assert page_features(mem.instruction, "Location: Hall\nFeedback: x", "go east") == [0.0] * (
        PAGE_FEATURES
    )


def test_page_features_see_an_ordered_click_sequence() -> None:
    state = render_state([Element(4, "button", "ONE"), Element(5, "button", "TWO")], LOADED)
    text = "Click button ONE, then click button TWO."
    in_order = 10
    assert page_features(text, state, "click [5]", previous="click [4]")[in_order] == 1
    assert page_features(text, state, "click [5]", previous="click [5]")[in_order] == 0
    assert page_features(text, state, "click [4]", previous="")[in_order] == 0
    # the second click ends the page either way: the features say which click this is
    second = 13
    assert page_features(text, state, "click [4]", previous="click [5]")[second] == 1
    assert page_features(text, state, "click [5]", previous="")[second] == 0
    # typing or an invalid command between the clicks does not hide the earlier click
    assert last_click(["click [4]", 'type [7] "x"', "scroll down"]) == "click [4]"
    assert last_click(['type [7] "x"']) == ""


def _button_sequence(first: str, second: str, n: int) -> Trajectory:
    """click-button-sequence: the page's text is the same after the first click."""
    task_id, text = "mw-click-button-sequence-train-0", "Click button ONE, then click button TWO."
    page = [Element(4, "button", "ONE"), Element(5, "button", "TWO")]
    won = (first, second) == ("click [4]", "click [5]")
    steps, feedback = [], LOADED
    for i, action in enumerate((first, second)):
        after = f"Clicked [{action[7:-1]}] button."
        if i == 1:
            after += f" The episode is over: {'success' if won else 'failure'}."
        steps.append(
            make_step(
                f"{task_id}-ep{n}",
                i,
                render_state(page, feedback),
                action,
                render_state(page, after),
                task_id=task_id,
                instruction=text,
                reward=int(won and i == 1),
                done=i == 1,
                admissible_actions=["click [4]", "click [5]"],
                env="miniwob",
            )
        )
        feedback = after
    return trajectory_of(steps)


def test_replay_tells_apart_what_a_page_does_not_show() -> None:
    orders = [("click [4]", "click [5]"), ("click [5]", "click [4]"), ("click [4]", "click [4]")]
    m = GroundedModel(GroundedSettings(seed=0))
    m.fit([_button_sequence(a, b, n) for n, (a, b) in enumerate(orders * 4)])
    first = _button_sequence("click [4]", "click [5]", 99)
    task = make_task(first.task_id, first.steps[0].instruction, env="miniwob")
    mem = EpisodeMemory.replay(task.instruction, first.initial_state)
    start = first.initial_state
    # click TWO first: recorded both as a first click (no end) and as ONE-then-TWO's win
    opening = m.predict(task, mem, start, "click [5]", ["click [4]", "click [5]"])
    assert (opening.won, opening.lost) == (False, False)
    mem.update("click [4]", first.steps[0].next_state)
    win = m.predict(task, mem, first.steps[0].next_state, "click [5]", ["click [4]", "click [5]"])
    assert win.won and win.evidence == "replay"


def test_page_features_tell_a_page_control_from_a_list_entry() -> None:
    results = [Element(9, "link", "Donovan"), Element(13, "link", "Jess"), Element(22, "link", "2")]
    state = render_state([Element(5, "textbox", "", value="Jess"), *results], LOADED)
    text = 'Use the textbox to enter "Jess" and press "Search", then find and click the 2nd result.'
    pager, off_entry = 11, 12
    turn_page = page_features(text, state, "click [22]")
    wrong_entry = page_features(text, state, "click [9]")
    named_entry = page_features(text, state, "click [13]")
    assert (turn_page[pager], turn_page[off_entry]) == (1, 0)
    assert (wrong_entry[pager], wrong_entry[off_entry]) == (0, 1)
    assert (named_entry[pager], named_entry[off_entry]) == (0, 0)


def test_fitted_model_judges_submits_on_unseen_pages(model: GroundedModel) -> None:
    assert model.pages
    assert model.fit_stats["page_edit_match"] == 1.0
    for p in (20, 21, 22, 23):
        page = _Page(p)
        task = make_task(page.task_id, page.instruction(), env="miniwob")
        wrong = next(x for x in page.labels if x != page.target)
        outcomes = {}
        for label in (page.target, wrong):
            page.checked = None
            start = page.state()
            mem = EpisodeMemory.replay(page.instruction(), start)
            click = model.predict(task, mem, start, page.click(label), page.admissible())
            assert f"{label} (checked)" in click.next_state
            assert not click.won and not click.lost
            assert click.next_state.endswith(
                f"Feedback: Clicked [{page.click(label)[7:-1]}] radio."
            )
            mem.update(page.click(label), click.next_state)
            outcomes[label] = model.predict(
                task, mem, click.next_state, "click [12]", page.admissible()
            )
        assert outcomes[page.target].won and outcomes[page.target].evidence == EDIT
        assert outcomes[wrong].lost and not outcomes[wrong].won


def test_batch_prediction_equals_one_by_one_on_pages(model: GroundedModel) -> None:
    queries = []
    for p in (20, 21):
        page = _Page(p)
        task = make_task(page.task_id, page.instruction(), env="miniwob")
        for label in page.labels:
            page.checked = label
            state = page.state()
            mem = EpisodeMemory.replay(page.instruction(), state)
            queries.append(Query(task, mem, state, "click [12]", page.admissible()))
    batch = model.predict_batch(queries)
    assert batch == [model.predict_batch([q])[0] for q in queries]
    assert sum(o.won for o in batch) == 2  # one right radio per page


def test_page_variants_swap_a_target_and_keep_typed_values(model: GroundedModel) -> None:
    page = _Page(3)
    variants = page_variants(page.instruction(), page.state(), random.Random(0), 10)
    assert sorted(variants) == sorted(
        f"Select {x} and click Submit." for x in page.labels if x != page.target
    )
    typed = render_state([Element(5, "textbox", "", ""), Element(6, "button", "Submit")], LOADED)
    assert page_variants('Enter "Joye" and press Submit.', typed, random.Random(0), 5) == []
    task = make_task(page.task_id, page.instruction(), env="miniwob")
    assert len(model.variants(task, 2, 0)) == 2


def test_policy_reads_a_page_command_with_its_element() -> None:
    page = _Page(2)
    commands = page.admissible()
    described = describe_commands(page.state(), commands)
    assert described is not None
    assert f"{page.click(page.target)} radio: {page.target} (unchecked)" in described
    assert describe_commands("Location: Hall\nFeedback: x", ["go east"]) is None
    form = render_state(
        [
            Element(4, "select", "", "Cuba", ("Cuba", "Chad")),
            Element(7, "textbox", "Username", ""),
            Element(8, "password", "Password", ""),
        ],
        LOADED,
    )
    asked = 'Select Chad and enter the username "ann" and the password "x1".'
    said = describe_commands(
        form, ['select [4] "Cuba"', 'type [7] "ann"', 'type [7] "x1"', 'type [8] "x1"'], asked
    )
    # no select command names the others' options; the value the label asks for is marked
    assert said == [
        'select [4] "Cuba" select',
        'type [7] "ann" textbox: Username as asked',
        'type [7] "x1" textbox: Username',
        'type [8] "x1" password: Password as asked',
    ]
    mem = EpisodeMemory.replay(page.instruction(), page.state())
    target, other = page.click(page.target), page.click(page.labels[(2 + 1) % 4])
    rows = {c: command_scalars(mem, c, t) for c, t in zip(commands, described, strict=True)}
    goal_overlap = len(VERBS) + 1  # overlap with the sentence ahead (after the verb one-hot)
    assert rows[target][goal_overlap] > rows[other][goal_overlap]
    assert np.isclose(
        command_scalars(mem, target)[goal_overlap], command_scalars(mem, other)[goal_overlap]
    )


def _page_steps(task_id: str, text: str, pages: list[list[Element]], actions: list[str]):
    """One real episode over ``pages`` (page i, then ``actions[i]`` shows page i + 1)."""
    steps, feedback = [], LOADED
    for i, action in enumerate(actions):
        kind = next(e.kind for e in pages[i] if f"[{e.ref}]" in action)
        after = f"Clicked [{action[7:-1]}] {kind}."
        steps.append(
            make_step(
                f"{task_id}-ep{len(actions)}",
                i,
                render_state(pages[i], feedback),
                action,
                render_state(pages[i + 1], after),
                task_id=task_id,
                instruction=text,
                admissible_actions=[f"click [{e.ref}]" for e in pages[i]],
                env="miniwob",
            )
        )
        feedback = after
    return trajectory_of(steps)


def test_an_autocomplete_entry_fills_its_field_on_unseen_pages() -> None:
    def page(game: int, typed: str, entries: list[str]) -> list[Element]:
        return [
            Element(5, "textbox", "Tags:", value=typed),
            Element(6, "button", "Submit"),
            *(Element(9 + 2 * i + game % 2, "option", x) for i, x in enumerate(entries)),
        ]

    words = [["Greece", "Greenland"], ["Angola", "Anguilla"], ["Bolivia", "Botswana"]]
    real = []
    for game, entries in enumerate(words):
        prefix = entries[0][:3]
        chosen = [Element(5, "textbox", "Tags:", value=entries[1]), Element(6, "button", "Submit")]
        pick = f"click [{11 + game % 2}]"
        real.append(
            _page_steps(
                f"mw-use-autocomplete-train-{game}",
                f'Enter "{prefix}"',
                [page(game, prefix, entries), chosen],
                [pick],
            )
        )
    m = GroundedModel(GroundedSettings(seed=0))
    m.fit(real)
    assert m.fit_stats["page_click_ops"] == {"option": "fill"}
    task = make_task("mw-use-autocomplete-train-7", 'Enter "Can"', env="miniwob")
    state = render_state(page(7, "Can", ["Canada", "Cameroon"]), LOADED)
    out = m.predict(
        task,
        EpisodeMemory.replay(task.instruction, state),
        state,
        "click [12]",
        ["click [5]", "click [6]", "click [10]", "click [12]"],
    )
    assert parse_page(out.next_state) == (
        Element(5, "textbox", "Tags:", value="Cameroon"),
        Element(6, "button", "Submit"),
    )
    assert out.admissible == ("click [5]", "click [6]")  # the entries are gone


def test_a_click_shows_the_recorded_page_whatever_its_ids() -> None:
    def results(start: int, names: list[str], pager: str) -> list[Element]:
        links = [Element(start + 4 * i, "link", x) for i, x in enumerate(names)]
        return [box, Element(6, "button", "Search"), *links, Element(start + 13, "link", pager)]

    box = Element(5, "textbox", "", value="Jess")
    text = 'Use the textbox to enter "Jess" and press "Search", then click the 4th result.'
    task_id = "mw-search-engine-train-0"
    first, second = results(9, ["Donovan", "Ann", "Cy"], "2"), results(30, ["Jess", "Bo"], "1")
    real = _page_steps(
        task_id,
        text,
        [[box, Element(6, "button", "Search")], first, second],
        ["click [6]", "click [22]"],
    )
    m = GroundedModel(GroundedSettings(seed=0))
    m.fit([real])
    task = make_task(task_id, text, env="miniwob")
    mem = EpisodeMemory.replay(text, real.initial_state)
    # page 1 re-rendered with other ids (as after a second search): its "2" shows page 2
    again = render_state(results(51, ["Donovan", "Ann", "Cy"], "2"), "Clicked [6] button.")
    turned = m.predict(task, mem, again, "click [64]", ["click [64]"])
    assert parse_page(turned.next_state) == tuple(second) and turned.evidence == "replay"
    assert turned.next_state.endswith("Clicked [64] link.") and not (turned.won or turned.lost)
    # Search pressed again on page 2: the same search shows the same first page
    research = m.predict(task, mem, render_state(second, LOADED), "click [6]", ["click [6]"])
    assert parse_page(research.next_state) == tuple(first) and not research.lost
    # the same "2" under another search (no recording of it): the page as the click leaves it
    box = Element(5, "textbox", "", value="Zed")
    other = render_state(results(9, ["Donovan", "Ann", "Cy"], "2"), LOADED)
    unseen = m.predict(task, mem, other, "click [22]", ["click [22]"])
    assert unseen.evidence == EDIT and unseen.next_state.startswith(other.rsplit("\n", 1)[0])
