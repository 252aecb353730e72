"""Fidelity metrics on known predictions: eps_R with its CI, state EM/F1, malformed rate."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from components.evaluation.fidelity import (
    admissible_summary,
    evaluate_fidelity,
    next_admissible,
    normalize_state,
    token_f1,
    wilson_interval,
)
from components.experience.format import render_answer


def test_metrics_on_known_predictions(train_examples):
    ex = train_examples[:4]
    outputs = [
        render_answer(ex[0].next_state, ex[0].reward, "fine"),  # exact
        render_answer(ex[1].next_state.upper() + " !", 1 - ex[1].reward, "wrong reward"),
        "<think>cut short</think><state>Location",  # truncated: malformed
        render_answer("Location: Room 9", ex[3].reward, "half right"),
    ]
    seen = []

    def generate(prompts):
        seen.append(prompts)
        return outputs

    summary, rows = evaluate_fidelity(generate, ex, with_reasoning=True)
    assert len(seen) == 1 and len(seen[0]) == 4  # one batched call
    assert summary["n"] == 4 and summary["n_malformed"] == 1
    assert summary["malformed_rate"] == 0.25
    assert summary["eps_R"] == 0.5  # the wrong reward and the malformed answer
    assert summary["eps_R_parsed"] == pytest.approx(1 / 3)
    assert summary["state_exact_match"] == 0.5  # normalisation ignores case and punctuation
    assert rows[2]["malformed"] and "unclosed <state>" in rows[2]["error"]
    assert rows[2]["reward_pred"] is None and rows[2]["state_f1"] == 0.0
    assert 0 < rows[3]["state_f1"] < 1
    expected_f1 = (1 + 1 + 0 + rows[3]["state_f1"]) / 4
    assert summary["state_token_f1"] == pytest.approx(expected_f1)
    assert summary["eps_P_proxy"] == 0.5
    assert summary["eps_R_ci95_low"] < 0.5 < summary["eps_R_ci95_high"]
    assert summary["malformed_reasons"] == {"unclosed <state>": 1}
    assert summary["n_reward_0"] + summary["n_reward_1"] == 4
    # success F1 beside "every step wins": 2w / (n + w) with w true wins
    w = summary["n_reward_1"]
    assert summary["always_win_baseline_success_f1"] == pytest.approx(2 * w / (4 + w))


def test_reasoning_free_answers_are_parsed_without_think(train_examples):
    ex = train_examples[:2]
    good = [render_answer(e.next_state, e.reward, None) for e in ex]
    summary, _ = evaluate_fidelity(lambda p: good, ex, with_reasoning=False)
    assert summary["eps_R"] == 0 and summary["state_exact_match"] == 1
    summary, _ = evaluate_fidelity(lambda p: good, ex, with_reasoning=True)
    assert summary["malformed_rate"] == 1 and summary["eps_R"] == 1


def test_token_f1_and_normalisation():
    assert (
        normalize_state("Location:  Kitchen.\nInventory: a KEY")
        == "location kitchen inventory a key"
    )
    assert token_f1("a b c d", "a b c d") == 1.0
    assert token_f1("a b", "c d") == 0.0
    assert token_f1("a b", "a b c d") == pytest.approx(2 * 1 * 0.5 / 1.5)


def test_wilson_interval():
    lo, hi = wilson_interval(0, 10)
    assert lo == 0 and hi == pytest.approx(0.2775, abs=1e-4)
    lo, hi = wilson_interval(5, 10)
    assert lo == pytest.approx(0.2366, abs=1e-4) and hi == pytest.approx(0.7634, abs=1e-4)


def test_admissible_commands_are_scored_beside_the_commands_stay_baseline():
    steps = [
        SimpleNamespace(episode_id="e", step_index=i, admissible_actions=adm)
        for i, adm in enumerate([["look", "take key"], ["look", "drop key"], None])
    ]
    real_next = next_admissible([SimpleNamespace(steps=steps)])
    assert real_next == {("e", 0): ["look", "drop key"]}  # the last step has no next list
    out = admissible_summary([(["drop key", "look"], real_next[("e", 0)], ["look", "take key"])])
    assert out["admissible_exact_match"] == 1.0 and out["admissible_f1"] == 1.0
    assert out["copy_baseline_admissible_exact_match"] == 0.0
    assert out["copy_baseline_admissible_f1"] == 0.5
    assert admissible_summary([]) == {"n_admissible": 0}


def test_eps_p_is_reported_per_transition_and_beside_nothing_changes(train_examples):
    # each prediction is the real next state of another transition: the pooled distance
    # cannot see it (same states, wrong steps); the per-transition share can
    ex = [e for e in train_examples if normalize_state(e.state) != normalize_state(e.next_state)]
    ex = ex[:6]
    shifted = [
        render_answer(ex[(i + 1) % len(ex)].next_state, e.reward, "x") for i, e in enumerate(ex)
    ]
    summary, rows = evaluate_fidelity(lambda p: shifted, ex, with_reasoning=True)
    wrong = sum(r["bucket_pred"] != r["bucket_true"] for r in rows) / len(rows)
    assert summary["eps_P"] == 0.0 and summary["eps_P_pointwise"] == wrong > 0
    copy_wrong = sum(r["bucket_copy"] != r["bucket_true"] for r in rows) / len(rows)
    assert summary["copy_baseline_eps_P_pointwise"] == copy_wrong
    assert 0.0 <= summary["copy_baseline_eps_P"] <= summary["copy_baseline_eps_P_pointwise"]
