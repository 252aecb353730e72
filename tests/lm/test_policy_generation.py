"""The policy decodes with the fast Generator: same answers as plain ``model.generate``."""

from __future__ import annotations

import pytest

from components.agent.policy import ACTION_STOP, Observation, PolicySettings
from components.agent.policy_model import PolicyModel
from components.lm.generate import Generator

ADMISSIBLE = ("go east", "take key", "open chest", "look")
OBSERVATIONS = [
    Observation("Open the chest.", "Location: Hall\nInventory: nothing", (), ADMISSIBLE),
    Observation("Take the key.", "Location: Vault\nA key on the floor.", (), ADMISSIBLE[:2]),
    Observation("Look around the vault and then open the chest.", "Location: Vault", (), ()),
]


@pytest.fixture(scope="module")
def policy() -> PolicyModel:
    """A random tiny policy (no reasoning) with a tokenizer trained on policy-like text."""
    import torch

    texts = [
        f"<action>{a}</action> {o.instruction} {o.state}" for o in OBSERVATIONS for a in ADMISSIBLE
    ]
    torch.manual_seed(0)
    return PolicyModel.tiny(
        texts * 10, preset="nano", vocab_size=400, settings=PolicySettings(with_reasoning=False)
    )


def test_greedy_answers_match_the_reference_generate(policy: PolicyModel) -> None:
    acts = policy.act(OBSERVATIONS, temperature=0.0, max_new_tokens=24)
    reference = Generator(policy.model, policy.tokenizer, fast=False).complete_ids(
        [list(a.prompt_ids) for a in acts],
        max_new_tokens=24,
        stop=(ACTION_STOP,),
        logprobs=True,
    )
    assert policy.generator.path == "fast"
    for act, ref in zip(acts, reference, strict=True):
        assert act.completion_ids == ref.token_ids
        assert act.text == ref.text
        assert act.logprobs == pytest.approx(ref.logprobs, abs=1e-4)
    # batch composition does not change a greedy answer (left padding is masked)
    alone = [policy.act([o], temperature=0.0, max_new_tokens=24)[0] for o in OBSERVATIONS]
    assert [a.completion_ids for a in alone] == [a.completion_ids for a in acts]


def test_sampled_logprobs_equal_rescoring_under_the_tempered_policy(policy: PolicyModel) -> None:
    import torch

    torch.manual_seed(3)
    acts = policy.act(OBSERVATIONS * 2, temperature=0.7, max_new_tokens=16)
    rescored = policy.completion_logprobs(
        [a.prompt_ids for a in acts], [a.completion_ids for a in acts], temperature=0.7
    )
    for act, lp in zip(acts, rescored, strict=True):
        assert 1 <= len(act.completion_ids) <= 16 and len(act.logprobs) == len(act.completion_ids)
        assert lp == pytest.approx(act.logprobs, abs=1e-4)
    torch.manual_seed(3)  # the RL loop seeds torch per round: sampling repeats exactly
    again = policy.act(OBSERVATIONS * 2, temperature=0.7, max_new_tokens=16)
    assert [a.completion_ids for a in again] == [a.completion_ids for a in acts]


def test_the_generator_follows_a_replaced_model(policy: PolicyModel) -> None:
    import copy

    first = policy.generator
    assert policy.generator is first  # reused between calls
    other = PolicyModel(copy.deepcopy(policy.model), policy.tokenizer, policy.settings)
    other.model = copy.deepcopy(policy.model)  # what add_lora does: a new module
    assert other.generator.model is other.model
