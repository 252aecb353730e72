"""Our GRPO loss equals TRL 1.16's GRPOTrainer loss on a single-turn batch.

What is compared: the same tiny model, the same prompt/completion token ids, the same old
and reference log-probs (perturbed so that ratios leave the clip range and the KL is not
zero) and the same advantages go into (a) ``components.agent.rl.turn_loss`` and (b) TRL's
own ``GRPOTrainer._compute_loss`` (its code, called on a real trainer). The loss values and
the gradients they give every parameter must match, for ``token`` aggregation vs TRL's
``bnpo`` and ``sequence`` vs TRL's ``grpo``, with and without the KL importance weight
(TRL's ``use_bias_correction_kl``, on by default). Only single-turn can be compared: TRL trains a
multi-turn episode as one concatenated completion, we train one row per turn.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from components.agent.policy_base import ActResult
from components.agent.policy_model import PolicyModel
from components.agent.rl import TurnRow, turn_loss
from tests.agent.rl_env import first_observation
from tests.factories import grpo_config

COMPLETIONS = ["<action>please</action>", "<action>sesame", "<action>abracadabra</action>", "x"]
ADVANTAGES = [1.0, -0.5, 0.3, -0.8]
BETA, EPS = 0.04, 0.2


def _grads(model) -> dict:
    return {n: p.grad.detach().clone() for n, p in model.named_parameters() if p.grad is not None}


@pytest.mark.filterwarnings("ignore:`gradient_checkpointing` is deprecated")
@pytest.mark.parametrize("kl_correction", [True, False], ids=["kl_is", "kl_plain"])
@pytest.mark.parametrize(("ours", "trl_type"), [("token", "bnpo"), ("sequence", "grpo")])
def test_grpo_loss_and_gradients_match_trl(
    magic_policy: PolicyModel, ours: str, trl_type: str, kl_correction: bool, tmp_path: Path
) -> None:
    import torch
    from datasets import Dataset
    from trl import GRPOConfig as TRLConfig
    from trl import GRPOTrainer

    policy = magic_policy
    tok = policy.tokenizer
    prompt = policy.prompt_ids([first_observation()])[0]  # one prompt: no left padding
    completions = [tok(c, add_special_tokens=False)["input_ids"] for c in COMPLETIONS]
    assert len({len(c) for c in completions}) > 1  # right padding is exercised

    with torch.no_grad():
        current = policy.sequence_logprobs([prompt] * 4, completions)
    gen = torch.Generator().manual_seed(0)
    mask = current.mask
    old = (current.logprobs + 0.4 * torch.randn(mask.shape, generator=gen)) * mask
    ref = (current.logprobs + 0.3 * torch.randn(mask.shape, generator=gen)) * mask

    # (a) ours
    rows = [
        TurnRow(
            episode=i,
            act=ActResult(
                "", "", None, None, tuple(prompt), tuple(c), tuple(old[i, : len(c)].tolist())
            ),
            advantage=ADVANTAGES[i],
            ref_logprobs=tuple(ref[i, : len(c)].tolist()),
        )
        for i, c in enumerate(completions)
    ]
    cfg = grpo_config(
        beta=BETA,
        clip_low=EPS,
        clip_high=EPS,
        aggregation=ours,
        kl_ratio_correction=kl_correction,
    )
    normalizer = float(sum(map(len, completions)) if ours == "token" else len(rows))
    policy.model.train()
    policy.model.zero_grad()
    our_loss, _, stats = turn_loss(policy, rows, cfg, normalizer)
    our_loss.backward()
    our_grads = _grads(policy.model)
    assert stats["clip"].any()  # the perturbation pushes some ratios out of the clip range

    # (b) TRL's GRPOTrainer on the same model
    args = TRLConfig(
        output_dir=str(tmp_path),
        per_device_train_batch_size=4,
        num_generations=4,
        beta=0.0,  # a non-zero beta makes TRL load the reference from the hub; set below
        epsilon=EPS,
        loss_type=trl_type,
        max_completion_length=16,
        use_cpu=True,
        bf16=False,
        gradient_checkpointing=False,
        report_to=[],
        temperature=1.0,
        use_bias_correction_kl=kl_correction,
    )
    trainer = GRPOTrainer(
        model=policy.model,
        reward_funcs=lambda completions, **kw: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_dict({"prompt": ["x"] * 4}),
        processing_class=tok,
    )
    trainer.beta = BETA  # _compute_loss reads the KL coefficient and ref logps from here
    trainer.current_gradient_accumulation_steps = 1
    width = mask.shape[1]
    pad = policy.pad_id
    inputs = {
        "prompt_ids": torch.tensor([prompt] * 4),
        "prompt_mask": torch.ones(4, len(prompt), dtype=torch.long),
        "completion_ids": torch.tensor([c + [pad] * (width - len(c)) for c in completions]),
        "completion_mask": mask.long(),
        "advantages": torch.tensor(ADVANTAGES),
        "old_per_token_logps": old,
        "ref_per_token_logps": ref,
        "num_items_in_batch": mask.sum(),
    }
    trainer.model.train()
    trainer.model.zero_grad()
    trl_loss = trainer._compute_loss(trainer.model, inputs)
    trl_loss.backward()
    trl_grads = _grads(trainer.model)

    assert float(our_loss.detach()) == pytest.approx(float(trl_loss.detach()), abs=1e-6)
    assert our_grads.keys() == trl_grads.keys()
    for name, g in our_grads.items():
        assert torch.allclose(g, trl_grads[name], atol=1e-5, rtol=1e-4), name
