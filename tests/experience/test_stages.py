"""The two stages end to end on a tiny LM experience model: trained, saved, registered,
measured (the grounded model of the cpu profile: tests/experience/test_grounded.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from components.config import AblationConfig, Paths, load_config
from components.schema import write_jsonl

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.integration
def test_train_then_evaluate_fidelity(tmp_path, trajectories, reasoning):
    import mlflow

    from components.artifacts import experience_checkpoint_dir, experience_model_dir
    from components.stages.experience import REGISTERED_MODEL, train_experience_model
    from components.stages.fidelity import evaluate_fidelity

    cfg = load_config(ROOT / "params.yaml", profile="ci")
    cfg = cfg.model_copy(
        update={
            # k = 0: no buffer needed, and not an ablation run (those register apart)
            "buffer": cfg.buffer.model_copy(update={"k": 0}),
            # the LM experience model (the gpu profile's kind), from scratch and tiny
            "experience": cfg.experience.model_copy(
                update={
                    "model": "tiny",
                    "tiny_preset": "nano",
                    "vocab_size": 512,
                    "max_train_examples": 64,
                    "max_steps": 10,
                    "eval_examples": 4,
                    "task_gen_examples": 0,
                }
            ),
        }
    )
    paths = Paths(tmp_path)
    write_jsonl(paths.trajectories_file, trajectories)
    paths.annotations_file.parent.mkdir(parents=True)
    paths.annotations_file.write_text(
        "".join(json.dumps({"id": i, "reasoning": r}) + "\n" for i, r in reasoning.items())
    )

    trained = train_experience_model(cfg, paths)
    out = experience_model_dir(paths)
    meta = json.loads((out / "experience_model.json").read_text())
    assert meta["prompt"] == {
        "history_len": 2,
        "k": 0,
        "with_reasoning": True,
        "state_target": cfg.experience.state_target,
    }
    assert (out / "model.safetensors").exists() and (out / "tokenizer.json").exists()
    assert trained["train_steps"] == cfg.experience.max_steps
    assert not experience_checkpoint_dir(paths).exists()  # finished runs leave no checkpoints
    assert json.loads((paths.metrics / "experience/full.json").read_text())["n_parameters"] > 0

    # an ablation variant: not registered, its prompt and target lose the think block
    ablated = train_experience_model(cfg, paths, variant="no_reasoning")
    assert ablated["registered_version"] is None
    ablated_dir = experience_model_dir(paths, "no_reasoning")
    meta = json.loads((ablated_dir / "experience_model.json").read_text())
    assert meta["prompt"]["with_reasoning"] is False and meta["variant"] == "no_reasoning"

    result = evaluate_fidelity(cfg, paths)
    assert set(result["variants"]) == {"full", "no_reasoning"}  # variants not trained: absent
    summary = result["variants"]["full"]
    assert summary["n"] == summary["n_transitions"] == 4
    assert 0 <= summary["eps_R"] <= 1 and 0 <= summary["malformed_rate"] <= 1
    assert summary["reward_accuracy"] == pytest.approx(1 - summary["eps_R"])
    assert 0 <= summary["eps_P"] <= 1 and "open_loop_depth" in summary
    saved = json.loads((paths.metrics / "fidelity.json").read_text())
    assert saved["full"]["n"] == 4 and "malformed_reasons" not in saved["full"]  # numbers only
    assert saved["_provenance"]["env"] == "textworld"  # metrics/ holds the last env run
    for key in ("reward_accuracy", "success_f1", "state_exact_match", "state_soft_match"):
        assert key in saved["no_reasoning"]
    headline = json.loads((paths.metrics / "headline" / "fidelity.json").read_text())
    assert headline["fidelity"]["reward_acc"] == round(saved["full"]["reward_accuracy"], 4)

    client = mlflow.MlflowClient()
    version = client.get_model_version_by_alias(REGISTERED_MODEL, "candidate")
    assert str(version.version) == trained["registered_version"] == result["registered_version"]
    assert version.source.startswith("runs:/") and version.source.endswith("/model")
    assert version.tags["fidelity.n"] == "4"
    # the floors' baselines ride along; the version loads by URI as a pyfunc model
    assert "baseline.reward_accuracy" in version.tags
    # a dst_path of our own: MLflow leaves its default download folder in /tmp
    (tmp_path / "loaded").mkdir()
    loaded = mlflow.pyfunc.load_model(
        f"models:/{REGISTERED_MODEL}@candidate", dst_path=str(tmp_path / "loaded")
    )
    step = trajectories[0].steps[0]
    row = {"instruction": step.instruction, "state": step.state, "action": step.action}
    out = loaded.predict(row)  # a tiny model may answer malformed: then None, never a guess
    assert list(out.columns) == ["next_state", "reward", "done", "reasoning"] and len(out) == 1

    # an ablation experiment registers apart and moves no alias
    ablation = cfg.model_copy(update={"ablation": AblationConfig(no_replay=True)})
    apart = train_experience_model(ablation, paths)
    mv = client.get_model_version(f"{REGISTERED_MODEL}-ablation", apart["registered_version"])
    assert mv.tags["ablation"] == "no_replay" and not mv.aliases
    assert (
        client.get_model_version_by_alias(REGISTERED_MODEL, "candidate").version == version.version
    )


@pytest.mark.parametrize("variant", ["full", "no_reasoning"])
def test_no_reasoning_is_refused_on_the_grounded_model(tmp_path, variant):
    """The grounded model does not reason: the ablation would change nothing, so it is
    refused in one line before any work (not silently rerun as the full method)."""
    from components.config import ConfigError
    from components.stages.experience import train_experience_model

    cfg = load_config(ROOT / "params.yaml", profile="cpu")
    assert cfg.experience.model == "grounded"
    if variant == "full":
        cfg = cfg.model_copy(update={"ablation": AblationConfig(no_reasoning=True)})
    with pytest.raises(ConfigError, match="does not reason"):
        train_experience_model(cfg, Paths(tmp_path), variant)
    assert not any(tmp_path.iterdir())


def test_a_variant_fitted_on_other_trajectories_is_not_scored_beside_full(tmp_path, caplog):
    # variants are trained by hand, outside DVC's graph: after new data, an old no_replay
    # was evaluated and reported as if it were full's ablation
    from components.artifacts import experience_model_dir
    from components.stages.experience import evaluable_variants, mark_trained_on

    paths = Paths(tmp_path)
    paths.trajectories_file.parent.mkdir(parents=True)
    for variant, data in (("no_replay", "old\n"), ("no_history", "new\n"), ("full", "new\n")):
        paths.trajectories_file.write_text(data)
        experience_model_dir(paths, variant).mkdir(parents=True)
        mark_trained_on(experience_model_dir(paths, variant), paths)
    assert evaluable_variants(paths) == ["full", "no_history"]
    assert "no_replay was fitted on other trajectories" in caplog.text
    (experience_model_dir(paths, "full") / "trained_on.json").unlink()  # an older full
    assert evaluable_variants(paths) == ["full", "no_history", "no_replay"]
