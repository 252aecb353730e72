"""Case 5, model output faults: adversarial experience-model answers are counted by reason.

DESIGN.md: the parser is strict; a malformed answer is counted, resampled once, else the
episode ends as a failure; it never crashes a run. Checked at the two places answers are
consumed: fidelity evaluation (counts per reason) and the synthetic env (resample, then
fail the episode). Policy output faults belong to the agent's tests.
"""

from __future__ import annotations

from collections import Counter

import pytest

from components.config import SyntheticEnvConfig
from components.evaluation.fidelity import evaluate_fidelity
from components.experience.dataset import ExperienceExample, PromptSettings
from components.experience.format import MalformedOutputError, parse_answer
from components.schema import Task

OK = "<think>The door opens.</think><state>Location: Hall</state><reward>0</reward>"
# (name, answer, the counted reason); None = a valid answer
ADVERSARIAL: list[tuple[str, str, str | None]] = [
    ("truncated", "<think>The door opens.</think><state>Location: Hall\nInvent",
     "unclosed <state>"),
    ("truncated_think", "<think>The door op", "unclosed <think>"),
    ("empty", "", "missing <think>"),
    ("nested_think", "<think>a <think>b</think></think><state>s</state><reward>0</reward>",
     "nested tag inside <think>"),
    ("nested_state", "<think>a</think><state>x<reward>1</reward></state><reward>0</reward>",
     "nested tag inside <state>"),
    ("two_answers", OK + OK.replace("0</reward>", "1</reward>"), "nested tag inside <state>"),
    ("reward_2", "<think>a</think><state>s</state><reward>2</reward>", "reward must be 0 or 1"),
    ("reward_float", "<think>a</think><state>s</state><reward>1.0</reward>",
     "reward must be 0 or 1"),
    ("reward_word", "<think>a</think><state>s</state><reward>one</reward>",
     "reward must be 0 or 1"),
    ("reward_fullwidth", "<think>a</think><state>s</state><reward>\uff11</reward>",
     "reward must be 0 or 1"),
    ("reward_zero_width", "<think>a</think><state>s</state><reward>1\u200b</reward>",
     "reward must be 0 or 1"),
    ("reward_empty", "<think>a</think><state>s</state><reward></reward>",
     "reward must be 0 or 1"),
    ("empty_think", "<think>  </think><state>s</state><reward>0</reward>", "empty <think>"),
    ("empty_state", "<think>a</think><state> </state><reward>0</reward>", "empty <state>"),
    ("text_before", "Sure! " + OK, "tags out of order or text outside the tags"),
    ("text_after", OK + " Hope this helps.", "tags out of order or text outside the tags"),
    ("out_of_order", "<state>s</state><think>a</think><reward>0</reward>",
     "tags out of order or text outside the tags"),
    ("missing_reward", "<think>a</think><state>s</state>", "missing <reward>"),
    ("unicode_garbage", "\x00\ufffd\u202e\U0001f600 \udcff", "missing <think>"),
    ("upper_case_tags", OK.upper(), "missing <think>"),
    ("ok", OK, None),
    ("ok_whitespace", "  <think>a</think>\n<state>s</state>\n<reward> 1 </reward>\n", None),
]  # fmt: skip


def _example(i: int) -> ExperienceExample:
    return ExperienceExample(
        id=f"t{i}",
        episode_id="ep",
        task_id="tw-quest-0",
        step_index=i,
        messages=({"role": "system", "content": "s"}, {"role": "user", "content": f"u{i}"}),
        answer=OK,
        state="Location: Kitchen",
        action="go east",
        next_state="Location: Hall",
        reward=0,
    )


def test_parser_names_the_reason_of_every_adversarial_answer() -> None:
    for name, answer, reason in ADVERSARIAL:
        if reason is None:
            parse_answer(answer)
            continue
        with pytest.raises(MalformedOutputError) as err:
            parse_answer(answer)
        assert str(err.value).startswith(reason), name


def test_fidelity_counts_malformed_answers_by_reason() -> None:
    examples = [_example(i) for i in range(len(ADVERSARIAL))]
    answers = [a for _, a, _ in ADVERSARIAL]
    summary, rows = evaluate_fidelity(lambda prompts: answers, examples, with_reasoning=True)
    expected = Counter(r for _, _, r in ADVERSARIAL if r is not None)
    assert summary["n"] == len(ADVERSARIAL)
    assert summary["n_malformed"] == sum(expected.values()) == len(ADVERSARIAL) - 2
    assert summary["malformed_reasons"] == dict(expected)
    # a malformed answer is a reward error (it would end the episode as a failure)
    assert all(r["reward_error"] for r in rows if r["malformed"])
    ok = [r for r in rows if not r["malformed"]]
    assert [r["reward_pred"] for r in ok] == [0, 1]
    assert summary["eps_R"] == pytest.approx((summary["n_malformed"] + 1) / summary["n"])
    print(f"\n[model output] {summary['n']} answers, malformed by reason: {dict(expected)}")


def test_synthetic_env_resamples_once_then_fails_the_episode() -> None:
    from components.experience.synthetic_env import MALFORMED, RealStateIndex, VectorSyntheticEnv

    bad = [(n, a) for n, a, r in ADVERSARIAL if r is not None]
    task = Task(task_id="tw-quest-0", env="textworld", family="quest", difficulty=1,
                split="train", instruction="Find the key.", seed=0)  # fmt: skip
    index = RealStateIndex(initial_states={task.task_id: "Location: Kitchen\nFeedback: hi"})
    calls = {"generate": 0, "resample": 0}

    def slot_of(prompt: list[dict[str, str]]) -> int:
        return int(prompt[-1]["content"].split("Action: act-")[1].split()[0])

    def generate(prompts):  # every first answer is adversarial
        calls["generate"] += 1
        return [bad[slot_of(p)][1] for p in prompts]

    def resample(prompts):  # the resample repairs even slots only
        calls["resample"] += 1
        return [OK if slot_of(p) % 2 == 0 else bad[slot_of(p)][1] for p in prompts]

    venv = VectorSyntheticEnv(
        generate, index, cfg=SyntheticEnvConfig(max_steps=3),
        prompt=PromptSettings(history_len=0, k=0), resample=resample,
    )  # fmt: skip
    venv.reset([task] * len(bad))
    outs = venv.step([f"act-{i}" for i in range(len(bad))])  # never raises
    n_even = (len(bad) + 1) // 2
    for i, out in enumerate(outs):
        assert out is not None
        obs, reward, terminated, truncated, info = out
        if i % 2:  # malformed twice: the episode ends as a failure, nothing recorded
            assert info[MALFORMED] and terminated and reward == 0 and not truncated
        else:
            assert not info[MALFORMED] and obs == "Location: Hall" and not terminated
    m = venv.metrics()
    assert calls == {"generate": 1, "resample": 1}  # one batched call each
    assert m["n_malformed"] == len(bad) + (len(bad) - n_even)
    assert m["n_resampled"] == len(bad)
    assert m["n_repaired"] == n_even
    assert m["n_failed_malformed"] == len(bad) - n_even
    assert len(venv.trajectories(policy="test")) == n_even  # failed episodes hold no steps
