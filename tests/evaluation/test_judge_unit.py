"""Judge building blocks without a simulator: entities, verdict parser, aggregation."""

from __future__ import annotations

import json

import pytest

from components.evaluation.judge import (
    CRITERIA,
    aggregate,
    compare_variants,
    diversity_by_task,
    effect_recalls,
    entities,
    judge_metrics,
    parse_verdict,
    sample_trajectories,
    to_score,
)
from components.teacher.base import MalformedAnswerError
from tests.evaluation.conftest import judge_config
from tests.factories import make_trajectory

STATE = (
    "Location: Study\nExits: west. The case is open and contains a passkey. The locker is "
    "closed. On the floor: a cashew.\nInventory: a Quote of the Day Calendar\n"
    "Feedback: You are in the Study."
)


def test_entities_are_head_nouns_of_article_phrases_location_and_inventory():
    assert entities(STATE) >= {"study", "case", "passkey", "locker", "cashew", "calendar"}
    assert "open" not in entities(STATE) and "west" not in entities(STATE)
    assert "unicorn" in entities("A golden unicorn stands here.")


def test_effect_recalls_see_relocations_that_word_sets_miss():
    before = "Location: Shed\nOn the board: a broom.\nInventory: a key\nFeedback: ok."
    after = (
        "Location: Shed\nNothing is on the board.\nInventory: a broom, a key\n"
        "Feedback: You take the broom from the board."
    )
    assert effect_recalls(after, before, after, "You take the broom from the board.") == (1, 1)
    fb, change = effect_recalls(before, before, after, "You take the broom from the board.")
    assert fb == 0.0 and change == 0.0


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('{"consistency": 2, "diversity": 1, "informativeness": 0, "hallucination": 2}', 2),
        (
            '```json\n{"consistency": 1, "diversity": 1, "informativeness": 1, '
            '"hallucination": 1, "rationale": "ok"}\n```',
            1,
        ),
    ],
)
def test_parse_verdict_accepts_one_json_object(text, expected):
    verdict = parse_verdict(text)
    assert verdict["consistency"] == expected and set(verdict) == {*CRITERIA, "rationale"}


@pytest.mark.parametrize(
    "text",
    [
        "The trajectory is consistent.",
        '{"consistency": 2, "diversity": 1, "informativeness": 0}',  # a criterion missing
        '{"consistency": 3, "diversity": 1, "informativeness": 0, "hallucination": 2}',
        '{"consistency": 2.0, "diversity": 1, "informativeness": 0, "hallucination": 2}',
        '{"consistency": true, "diversity": 1, "informativeness": 0, "hallucination": 2}',
        '{"consistency": "2", "diversity": 1, "informativeness": 0, "hallucination": 2}',
        '{"consistency": 2, "diversity": 1, "informativeness": 0, "hallucination": 2, "x": 1}',
        '{"consistency": 2, "diversity": 1, "informativeness": 0, "hallucination": 2,',
        '[{"consistency": 2}]',
        'Sure! {"consistency": 2, "diversity": 1, "informativeness": 0, "hallucination": 2}',
        '{"consistency": 2, "diversity": 1, "informativeness": 0, "hallucination": 2, '
        '"rationale": 5}',
    ],
)
def test_parse_verdict_rejects_everything_else(text):
    with pytest.raises(MalformedAnswerError):
        parse_verdict(text)


def test_to_score_rounds_half_up_within_the_rubric():
    assert [to_score(v) for v in (0.0, 0.49, 0.5, 1.49, 1.5, 2.0, 2.7)] == [0, 0, 1, 1, 2, 2, 2]


def test_aggregate_means_and_distributions_ignore_failed_rows():
    rows = [
        {
            "status": "ok",
            "consistency": 2,
            "diversity": 1,
            "informativeness": 0,
            "hallucination": 2,
        },
        {
            "status": "ok",
            "consistency": 0,
            "diversity": 1,
            "informativeness": 2,
            "hallucination": 2,
        },
        {"status": "failed", **dict.fromkeys(CRITERIA)},
        {"status": "skipped", **dict.fromkeys(CRITERIA)},
    ]
    s = aggregate(rows)
    assert (s["n"], s["n_failed"], s["n_skipped"]) == (2, 1, 1)
    assert s["consistency"]["mean"] == 1.0
    assert s["consistency"]["distribution"] == {"0": 1, "1": 0, "2": 1}
    assert judge_metrics(s) == {
        "consistency": 1.0,
        "diversity": 1.0,
        "informativeness": 1.0,
        "hallucination": 2.0,
        "n": 2,
    }
    empty = aggregate([])
    assert empty["n"] == 0 and empty["consistency"]["mean"] is None


def test_compare_variants_orders_the_ablations_and_renders_markdown():
    def summary(score: int, n: int) -> dict:
        row = {"status": "ok", **dict.fromkeys(CRITERIA, score)}
        return aggregate([row] * n)

    table, md = compare_variants(
        {"no_replay": summary(0, 3), "custom": summary(1, 1), "full": summary(2, 5)}
    )
    assert list(table) == ["full", "no_replay", "custom"]
    assert table["full"]["consistency"] == 2.0 and table["no_replay"]["n"] == 3
    lines = md.splitlines()
    assert lines[0].startswith("| variant | n | consistency")
    assert lines[2].startswith("| DreamGym (full) | 5 | 2.00")
    assert lines[3].startswith("| w/o replay | 3 | 0.00")


def _synthetic(**kw):
    traj = make_trajectory(**kw)
    steps = [s.model_copy(update={"source": "synthetic"}) for s in traj.steps]
    return traj.model_copy(update={"source": "synthetic", "steps": steps})


def test_diversity_is_a_set_level_score_per_task():
    cfg = judge_config()
    varied = [_synthetic(idx=i, n_steps=4) for i in range(3)]  # same states and actions
    other = _synthetic(task_id="tw-quest-9", n_steps=4)
    div = diversity_by_task([*varied, other], cfg)
    ratio, score = div["tw-quest-0"]
    # 3 identical episodes: 4 distinct next states and 4 distinct actions in 12 transitions
    assert ratio == pytest.approx(0.5 * (4 + 4) / 12) and score == 1
    assert div["tw-quest-9"] == (1.0, 2)


def test_sample_is_seeded_bounded_and_synthetic_only():
    pool = [_synthetic(idx=i) for i in range(10)] + [make_trajectory(idx=99)]
    a = sample_trajectories(pool, 4, seed=1)
    assert len(a) == 4 and all(t.source == "synthetic" for t in a)
    assert [t.episode_id for t in a] == [
        t.episode_id for t in sample_trajectories(list(reversed(pool)), 4, seed=1)
    ]
    assert len(sample_trajectories(pool, 100, seed=1)) == 10
    assert json.dumps([t.episode_id for t in a]) != json.dumps(
        [t.episode_id for t in sample_trajectories(pool, 4, seed=2)]
    )
