"""bench.verdicts on a hand-made click-button-sequence page: its train steps, its keys."""

from __future__ import annotations

from bench.verdicts import step_verdicts, undecided_keys
from components.experience.grounded import GroundedModel, GroundedSettings
from tests.experience.test_grounded_page import _button_sequence
from tests.factories import make_task


def test_verdicts_count_agreement_and_the_keys_the_previous_click_decides() -> None:
    orders = [("click [4]", "click [5]"), ("click [5]", "click [4]"), ("click [4]", "click [4]")]
    trajectories = [_button_sequence(a, b, n) for n, (a, b) in enumerate(orders * 3)]
    model = GroundedModel(GroundedSettings(seed=0))
    model.fit(trajectories)
    first = trajectories[0]
    task = make_task(
        first.task_id, first.steps[0].instruction, env="miniwob", family="click-button-sequence"
    )
    out = step_verdicts(model, {task.task_id: task}, trajectories)
    # the page's text is the same before and after the first click: only the previous
    # click tells a first TWO (goes on) from ONE-then-TWO's (won)
    assert out["train"]["steps"] == 18
    assert out["train"]["agreement"] == 1.0
    assert out["validation"]["steps"] == 0
    keys = undecided_keys(model)
    assert keys["undecided"] == 2  # click ONE and click TWO on the one page text
    assert keys["resolved_by_previous_command"] == 2
