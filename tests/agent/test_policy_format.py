"""The policy's prompt/answer format: strict parsing, and the same prompt offline and live."""

from __future__ import annotations

import pytest

from components.agent.evaluate import parse
from components.agent.policy import (
    MAX_ACTION_CHARS,
    MalformedActionError,
    Observation,
    PolicySettings,
    expert_reasoning,
    parse_answer,
    render_answer,
    render_prompt,
)
from components.agent.policy_base import MALFORMED_ACTION
from components.agent.sft_data import answer_for, feedback_of, history_of, observation_at


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("take key", "missing <think>"),
        ("<think>ok</think>take key", "missing <action>"),
        ("<think>ok</think><action>take key", "unclosed <action>"),
        ("<think>ok</think><action>   </action>", "empty <action>"),
        ("<think></think><action>take key</action>", "empty <think>"),
        ("<think>ok</think><action>take <action>key</action></action>", "nested tag"),
        ("<think>a <think>b</think></think><action>go</action>", "nested tag"),
        ("<think>ok</think><action>take key</action> and then open chest", "text outside"),
        ("<action>take key</action><think>ok</think>", "out of order"),
        (f"<think>ok</think><action>{'x' * (MAX_ACTION_CHARS + 1)}</action>", "longer"),
    ],
)
def test_parser_rejects_malformed_answers(text, reason):
    with pytest.raises(MalformedActionError, match=reason):
        parse_answer(text, with_reasoning=True)
    parsed = parse(text, with_reasoning=True)  # the evaluator's never-raising wrapper
    assert parsed.malformed and parsed.action == MALFORMED_ACTION and reason in parsed.error


def test_parser_rejects_nested_tags_and_think_without_reasoning():
    with pytest.raises(MalformedActionError, match="nested tag inside <action>"):
        parse_answer("<think>ok</think><action>go <think> east</action>")
    with pytest.raises(MalformedActionError, match="unexpected <think>"):
        parse_answer("<think>ok</think><action>go</action>", with_reasoning=False)


def test_parser_accepts_and_normalises_well_formed_answers():
    decision = parse_answer("  <think> go on </think>\n<action>take   the\nkey</action>\n")
    assert decision.action == "take the key" and decision.reasoning == "go on"
    assert parse_answer("<action>look</action>", with_reasoning=False).reasoning is None
    assert not parse("<action>look</action>", with_reasoning=False).malformed


def test_training_targets_parse_back_to_their_action():
    admissible = ("go east", "look")
    for action in ("go east", "sing"):  # admissible or not, the reasoning stays truthful
        for settings in (PolicySettings(), PolicySettings(with_reasoning=False)):
            answer = answer_for(action, admissible, settings)
            assert parse_answer(answer, settings.with_reasoning).action == action
    assert "not among the admissible" in expert_reasoning("sing", admissible)
    assert render_answer("look", None) == "<action>look</action>"


def test_prompt_shows_only_recent_history_and_sorted_admissible_actions():
    obs = Observation(
        instruction="Open the chest.",
        state="Location: Hall\nInventory: nothing\nFeedback: hi",
        history=(("a1", "f1"), ("a2", "f2"), ("a3", "f3")),
        admissible=("look", "go east", "take key"),
    )
    user = render_prompt(obs, PolicySettings(history_len=2, max_admissible=2))[1]["content"]
    assert "a1 -> f1" not in user and "- a2 -> f2\n- a3 -> f3" in user
    assert "Admissible actions: go east; look" in user  # sorted, then cut to 2
    bare = render_prompt(obs, PolicySettings(history_len=0, show_admissible=False))[1]["content"]
    assert "Recent history" not in bare and "Admissible" not in bare


def test_offline_observations_use_recent_action_feedback_pairs(box_trajectories):
    traj = box_trajectories[0]
    settings = PolicySettings(history_len=1)
    obs = observation_at(traj, 2, settings)
    # the observation keeps the whole episode; the prompt shows the last history_len steps
    assert [a for a, _ in obs.history] == ["go east", "take key"]
    assert obs.initial_state == traj.initial_state
    assert obs.state == traj.steps[2].state and obs.admissible == ("go west", "look", "open chest")
    user = render_prompt(obs, settings)[1]["content"]
    assert "- take key -> You take the key." in user and "go east ->" not in user
    assert history_of(traj.steps[:0]) == ()
    assert feedback_of("no feedback line") == "no feedback line"


@pytest.mark.integration
def test_live_episode_sees_exactly_the_offline_prompts(agent_tw_suite):
    """Replaying a real expert episode in the evaluator gives the prompts SFT trained on."""
    from components.agent.evaluate import ParsedAnswer, apply_answer, start_episode
    from components.data.collect import EpisodePlan, run_episode
    from components.envs.textworld_env import TextWorldEnv

    task = agent_tw_suite.task("cooking", "train")
    settings = PolicySettings(history_len=2)
    env = TextWorldEnv(max_steps=agent_tw_suite.cfg.env.max_steps, root=agent_tw_suite.root)
    try:
        plan = EpisodePlan("ep", task.task_id, "expert", 0, 0)
        traj = run_episode(env, task, plan, epsilon=0.0, p_invalid=0.0)
        assert traj.success and traj.n_steps >= 3
        episode = start_episode(task, 0, env)
        record = None
        for i, step in enumerate(traj.steps):
            live = episode.seen
            assert render_prompt(live, settings) == render_prompt(
                observation_at(traj, i, settings), settings
            )
            record = apply_answer(
                episode, ParsedAnswer(f"<action>{step.action}</action>", step.action)
            )
        assert record is not None and record.success and record.steps == traj.n_steps
    finally:
        env.close()
