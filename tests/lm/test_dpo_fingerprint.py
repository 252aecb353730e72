"""The DPO resume fingerprint covers every agent setting the DPO trainer reads."""

from __future__ import annotations

import pytest

from components.config import AgentConfig
from components.stages.agent_lm import dpo_fingerprint


@pytest.mark.parametrize(
    "change",
    [
        {"lora": True},
        {"lora_r": 8},
        {"lora_alpha": 64},
        {"bf16": True},
        {"max_length": 256},
    ],
)
def test_a_setting_the_trainer_reads_changes_the_fingerprint(change) -> None:
    base = AgentConfig(policy="lm")
    before = dpo_fingerprint(base, "md5-of-sft", [])
    after = dpo_fingerprint(base.model_copy(update=change), "md5-of-sft", [])
    assert after != before


def test_budgets_and_logging_leave_the_fingerprint_alone() -> None:
    base = AgentConfig(policy="lm")
    dpo = base.dpo.model_copy(update={"logging_steps": 7, "max_train_minutes": 1.0})
    assert dpo_fingerprint(base.model_copy(update={"dpo": dpo}), "m", []) == dpo_fingerprint(
        base, "m", []
    )
    assert dpo_fingerprint(base, "m", []) != dpo_fingerprint(base, "other", [])
