"""The scoring policy's DPO honours agent.dpo.loss_type (sigmoid, ipo, hinge: TRL's)."""

from __future__ import annotations

import copy
import math
from pathlib import Path
from typing import Any

import pytest

from components.agent.policy import Observation
from components.config import load_config

ROOT = Path(__file__).resolve().parents[2]
QUEST = "Welcome! First, go east. Then, take the key from the table. Once done, you win!"
STATE = "Location: Hall\nExits: east, west. On the table: a key.\nInventory: nothing\nFeedback: ."


def _demos() -> list[Any]:
    from components.agent.scorer_training import Demonstration

    commands = ("go east", "go west", "look", "take key from table")
    obs = Observation(QUEST, STATE, admissible=commands, initial_state=STATE)
    return [Demonstration(f"t{i}", obs, commands[i % 2 * 3]) for i in range(4)]


@pytest.fixture
def sft_scorer() -> Any:
    from components.agent.scorer import ScorerPolicy, ScorerSettings

    return ScorerPolicy(ScorerSettings(max_steps=10), seed=0)


def _copy(policy: Any) -> Any:
    from components.agent.scorer import ScorerPolicy

    return ScorerPolicy(
        policy.scorer_settings, encoder=policy.encoder, net=copy.deepcopy(policy.model)
    )


def test_the_dpo_losses_are_trls() -> None:
    import torch

    from components.agent.scorer_training import dpo_loss

    margin, beta = torch.tensor([-2.0, 0.0, 3.0]), 0.5
    sig = [-math.log(1 / (1 + math.exp(-beta * m))) for m in margin.tolist()]
    hinge = [max(0.0, 1 - beta * m) for m in margin.tolist()]
    ipo = [(m - 1 / (2 * beta)) ** 2 for m in margin.tolist()]
    for kind, expected in (("sigmoid", sig), ("hinge", hinge), ("ipo", ipo)):
        assert float(dpo_loss(margin, beta, kind)) == pytest.approx(sum(expected) / 3)
    with pytest.raises(ValueError, match="loss_type"):
        dpo_loss(margin, beta, "sft")


def test_ipo_and_hinge_train_the_scorer_and_differ_from_sigmoid(sft_scorer, one_thread) -> None:
    import torch

    from components.agent.scorer_training import preference_pairs, train_dpo

    pairs = preference_pairs(_demos(), 2, seed=0)
    start = {k: v.clone() for k, v in sft_scorer.model.state_dict().items()}
    losses, weights = {}, {}
    for kind in ("sigmoid", "ipo", "hinge"):
        policy = _copy(sft_scorer)
        result = train_dpo(
            policy, pairs, beta=0.1, epochs=2, learning_rate=1e-2, batch_size=4,
            loss_type=kind, seed=0,
        )  # fmt: skip
        losses[kind] = result["train_loss"]
        weights[kind] = policy.model.state_dict()
        moved = [k for k, v in weights[kind].items() if not torch.equal(v, start[k])]
        assert moved, f"{kind}: no parameter moved"
    assert len({losses["sigmoid"], losses["ipo"], losses["hinge"]}) == 3, losses
    for kind in ("ipo", "hinge"):
        assert any(not torch.equal(v, weights["sigmoid"][k]) for k, v in weights[kind].items())
    with pytest.raises(ValueError, match="loss_type"):
        train_dpo(_copy(sft_scorer), pairs, beta=0.1, epochs=1, learning_rate=1e-2,
                  batch_size=4, loss_type="robust")  # fmt: skip


def test_the_dpo_stage_hands_the_configured_loss_to_the_scorer(tmp_path, monkeypatch) -> None:
    import components.agent.loading as loading
    import components.agent.scorer_training as scorer_training
    from components.config import Paths
    from components.stages.agent import dpo_seed

    given: dict[str, Any] = {}

    class Trained(Exception):
        pass

    def fake_train(policy: Any, pairs: Any, **kw: Any) -> Any:
        given.update(kw)
        raise Trained  # the settings handed on are all this test needs

    cfg = load_config(ROOT / "params.yaml", profile="cpu")
    dpo = cfg.agent.dpo.model_copy(update={"loss_type": "ipo"})
    cfg = cfg.model_copy(update={"agent": cfg.agent.model_copy(update={"dpo": dpo})})
    monkeypatch.setattr(loading, "load_policy", lambda *a, **kw: None)
    monkeypatch.setattr(scorer_training, "train_dpo", fake_train)
    with pytest.raises(Trained):
        dpo_seed(cfg, Paths(tmp_path), 0, _demos())
    assert given["loss_type"] == "ipo"
