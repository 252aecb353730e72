"""Registered models load by URI with MLflow's own API and predict (issue 23, item 1)."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.config import load_config
from tests.agent.conftest import BOX_EXPERT, box_trajectory

ROOT = Path(__file__).resolve().parents[2]
HALL = "Location: Hall\nAn exit leads east.\nInventory: nothing\nFeedback: You are in the Hall."
VAULT = "Location: Vault\nA chest. A key on the floor.\nInventory: nothing\nFeedback: "
INSTRUCTION = "Take the key and open the chest."


def _episodes() -> list:
    return [
        box_trajectory("box-0", BOX_EXPERT, "expert", 0),
        box_trajectory("box-0", ["look", "sing", *BOX_EXPERT], "noisy", 1),
        box_trajectory("box-0", ["go east", "go west", "look", "look"], "noisy", 2),
        box_trajectory("box-1", BOX_EXPERT, "expert", 3),
    ]


def _register(tmp_path: Path, local_dir: Path, name: str, kind: str) -> str:
    from components import model_registry, tracking

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    with tracking.stage_run("train", "test", cfg, (), tmp_path) as run:
        return model_registry.register_model_dir(run, local_dir, name, ("candidate",), kind=kind)


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_experience_model_loads_by_alias_and_predicts_the_next_state(tmp_path: Path):
    import mlflow

    from components.experience.grounded import GroundedModel, GroundedSettings
    from components.registry_models import raw_model_dir

    model = GroundedModel(GroundedSettings(seed=0))
    model.fit(_episodes())
    model.save(tmp_path / "grounded")
    _register(tmp_path, tmp_path / "grounded", "experience-model", "experience")

    # a dst_path of our own: MLflow leaves its default download folder in /tmp
    (tmp_path / "loaded").mkdir()
    loaded = mlflow.pyfunc.load_model(
        "models:/experience-model@candidate", dst_path=str(tmp_path / "loaded")
    )
    out = loaded.predict(
        {
            "task_id": "box-0",
            "instruction": INSTRUCTION,
            "state": HALL,
            "action": "go east",
            "admissible": ["go east", "look"],
        }
    )
    assert list(out.columns) == ["next_state", "reward", "done", "reasoning"]
    row = out.iloc[0]
    assert row["next_state"].startswith("Location: Vault") and row["reward"] == 0
    assert not row["done"] and row["reasoning"]
    # the raw folder is still there, byte for byte, and loads with the project's loader
    raw = raw_model_dir("models:/experience-model@candidate", tmp_path / "dl")
    assert GroundedModel.load(raw).exact == model.exact


@pytest.mark.integration
@pytest.mark.timeout(300)
def test_policy_loads_by_alias_and_predicts_an_action(tmp_path: Path):
    import mlflow
    import pandas as pd

    from components.agent.loading import save_policy
    from components.agent.scorer import ScorerPolicy, ScorerSettings
    from components.agent.scorer_training import expert_steps, train_sft

    policy = ScorerPolicy(ScorerSettings(max_steps=10), seed=0)
    demos, _ = expert_steps(_episodes())
    train_sft(policy, demos, epochs=30, learning_rate=3e-3, batch_size=8, seed=0)
    save_policy(policy, tmp_path / "policy", {"method": "sft", "seed": 0})
    _register(tmp_path, tmp_path / "policy", "policy", "policy")

    # a dst_path of our own: MLflow leaves its default download folder in /tmp
    (tmp_path / "loaded").mkdir()
    loaded = mlflow.pyfunc.load_model("models:/policy@candidate", dst_path=str(tmp_path / "loaded"))
    rows = pd.DataFrame(
        [
            {"instruction": INSTRUCTION, "state": HALL, "admissible": ["go east", "look"]},
            {
                "instruction": INSTRUCTION,
                "state": VAULT,
                "admissible": ["go west", "look", "take key"],
                "history": [["go east", VAULT]],
                "initial_state": HALL,
            },
        ]
    )
    out = loaded.predict(rows)
    assert list(out["action"]) == ["go east", "take key"] and not out["malformed"].any()
