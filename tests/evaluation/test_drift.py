"""Evidently drift of synthetic from real transitions: flags a shift, not an identical set."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from components.config import DriftConfig
from components.evaluation.drift import (
    HashingEmbedder,
    by_iteration,
    drift_by_iteration,
    drift_by_run,
    drift_metrics,
    make_drift_embedder,
    real_vocabulary,
    text_features,
)
from components.schema import Provenance, Transition, stable_id
from tests.factories import make_step

pytestmark = [pytest.mark.integration, pytest.mark.timeout(300)]

ROOMS = ["kitchen", "garden", "study", "cellar", "attic", "garage", "pantry", "hall"]
THINGS = ["apple", "key", "lamp", "book", "shovel", "coin", "map", "rope", "knife", "cup"]
VERBS = ["go", "take", "open", "put", "examine"]


def real_transitions(n_episodes: int = 30, steps: int = 5, seed: int = 0) -> list[Transition]:
    """TextWorld-like real transitions with varied rooms, objects, verbs and rare wins."""
    rng = random.Random(seed)
    out = []
    for e in range(n_episodes):
        episode_id = stable_id("drift", e)
        room = rng.choice(ROOMS)
        for i in range(steps):
            things = rng.sample(THINGS, rng.randint(1, 4))
            state = (
                f"Location: {room.title()}\nExits: north. On the table: "
                + ", ".join(f"a {t}" for t in things)
                + ".\nInventory: nothing\nFeedback: ok."
            )
            verb = rng.choice(VERBS)
            out.append(
                make_step(
                    episode_id,
                    i,
                    state,
                    f"{verb} {rng.choice(things)}",
                    state.replace("ok.", f"You {verb} it."),
                    task_id=f"tw-{e % 6}",
                    instruction="Find the key.",
                    reward=int(i == steps - 1 and rng.random() < 0.3),
                    done=i == steps - 1,
                )
            )
    return out


def as_synthetic(rows: list[Transition], iteration: int) -> list[Transition]:
    """The same transitions recorded as synthetic experience of an iteration."""
    prov = Provenance(policy="agent", iteration=iteration, checkpoint=f"ckpt-{iteration}")
    return [r.model_copy(update={"source": "synthetic", "provenance": prov}) for r in rows]


def shifted(rows: list[Transition], iteration: int) -> list[Transition]:
    """A degenerate experience model: long repetitive invented states, frequent wins."""
    rng = random.Random(1)
    out = []
    for r in as_synthetic(rows, iteration):
        blob = " ".join(["The zorblax quivers near a glimmering vortex."] * rng.randint(6, 9))
        out.append(
            r.model_copy(
                update={
                    "next_state": f"Location: Void\n{blob}\nInventory: a vortex",
                    "action": "dance with the zorblax",
                    "reward": int(rng.random() < 0.6),
                }
            )
        )
    return out


CFG = DriftConfig(embedder="hashing", max_rows=200, embedding_components=2)


@pytest.fixture(scope="module")
def result(tmp_path_factory):
    real = real_transitions()
    synthetic = [*as_synthetic(real, 1), *shifted(real, 2), *as_synthetic(real[:3], 3)]
    out_dir = tmp_path_factory.mktemp("drift")
    return out_dir, drift_by_iteration(real, synthetic, CFG, out_dir)


def test_identical_synthetic_experience_does_not_drift(result):
    _, res = result
    it = res["iterations"]["1"]
    assert it["drifted"] is False and it["drift_share"] == 0.0 and it["n_drifted"] == 0
    assert not any(f["drifted"] for f in it["features"].values())
    assert it["reference"]["reward_rate"] == it["current"]["reward_rate"]


def test_shifted_synthetic_experience_drifts_on_every_kind_of_feature(result):
    _, res = result
    it = res["iterations"]["2"]
    assert it["drifted"] is True and it["drift_share"] >= CFG.drift_share
    flagged = {name for name, f in it["features"].items() if f["drifted"]}
    expected = {"state_chars", "state_ttr", "state_oov", "reward", "action_verb", "emb_dist"}
    assert expected <= flagged
    assert it["current"]["reward_rate"] > it["reference"]["reward_rate"]
    assert it["current"]["state_oov_mean"] > 0.3 > it["reference"]["state_oov_mean"]
    # every feature carries the method and threshold Evidently used
    assert all(f["method"] and f["threshold"] for f in it["features"].values())


def test_each_iteration_gets_an_html_report_and_the_overall_flag(result):
    out_dir, res = result
    assert res["n_iterations"] == 3 and res["drifted"] and res["n_drifted_iterations"] == 1
    for it in ("1", "2"):
        html = Path(res["iterations"][it]["html"])
        assert html.parent == out_dir and html.name == f"drift_iter{it}.html"
        assert "<html" in html.read_text(encoding="utf-8")[:2000].lower()
    # too few rows for a test: reported as skipped, never as "no drift"
    small = res["iterations"]["3"]
    assert small["drifted"] is None and "skipped" in small and "html" not in small
    metrics = drift_metrics(res)
    assert metrics["iter_1"]["drifted"] is False and metrics["iter_2"]["drifted"] is True
    assert set(metrics["iter_2"]) >= {"drift_share", "drifted"}


def test_vocabulary_and_features_are_computed_the_same_way_for_both_sides():
    real = real_transitions(n_episodes=4)
    vocab = real_vocabulary(real, min_episodes=2)
    assert "zorblax" not in vocab and "table" in vocab
    f = text_features(shifted(real[:1], 1)[0], vocab)
    assert f["action_verb"] == "dance" and f["state_oov"] > 0.3 and 0 < f["state_ttr"] < 0.5
    assert set(by_iteration(as_synthetic(real, 4) + as_synthetic(real, 2))) == {2, 4}


def test_hashing_embedder_is_deterministic_and_unit_norm():
    emb = HashingEmbedder()
    a = emb.embed(["a red apple on the table", "a red apple on the table", ""])
    assert a.shape == (3, emb.dim) and a.dtype == np.float32
    assert np.allclose(np.linalg.norm(a[:2], axis=1), 1.0) and not a[2].any()
    assert np.array_equal(a[0], a[1])
    assert make_drift_embedder(DriftConfig(embedder="none")) is None


def test_index_page_links_each_iteration_report_and_flags_drift(tmp_path: Path):
    from components.evaluation.drift import index_html

    report = tmp_path / "reports" / "drift" / "dreamgym_grpo" / "drift_iter1.html"
    runs = {
        "dreamgym_grpo": {
            "drifted": True,
            "iterations": {
                "0": {"skipped": "fewer than 5 transitions on a side", "n_current": 3},
                "1": {
                    "drift_share": 0.75,
                    "drifted": True,
                    "n_current": 40,
                    "html": str(report),
                    "features": {"state_oov": {"drifted": True}, "reward": {"drifted": False}},
                },
            },
        }
    }
    index = tmp_path / "reports" / "drift.html"
    text = index_html(runs, index, threshold=0.5)
    assert index.read_text() == text
    assert "<h2>dreamgym_grpo: drift flagged</h2>" in text
    assert "href='drift/dreamgym_grpo/drift_iter1.html'" in text  # relative: the dir moves
    assert "<td>0.75</td><td>True</td><td>state_oov</td>" in text
    assert "skipped: fewer than 5 transitions" in text


def test_only_first_last_and_flagged_iterations_keep_an_html_report(tmp_path: Path):
    real = real_transitions()
    synthetic = [
        *as_synthetic(real, 1),
        *as_synthetic(real, 2),
        *shifted(real, 3),
        *as_synthetic(real, 4),
    ]
    res = drift_by_iteration(real, synthetic, CFG, tmp_path)
    kept = sorted(p.name for p in tmp_path.glob("*.html"))
    assert kept == ["drift_iter1.html", "drift_iter3.html", "drift_iter4.html"]
    its = res["iterations"]
    assert its["2"]["html"] is None and "not kept" in its["2"]["report_note"]
    assert its["2"]["drift_share"] == 0.0  # its metrics are still there
    assert its["3"]["html"] == str(tmp_path / "drift_iter3.html")


@pytest.mark.integration
def test_reports_in_worker_processes_equal_those_in_process(result, tmp_path: Path):
    from functools import partial

    from components.stages.parallel import run_jobs

    out_dir, serial = result
    real = real_transitions()
    synthetic = [*as_synthetic(real, 1), *shifted(real, 2), *as_synthetic(real[:3], 3)]
    parallel = drift_by_iteration(
        real,
        synthetic,
        CFG,
        tmp_path,
        run_jobs=partial(run_jobs, workers=2),
    )

    def strip(res: dict) -> dict:
        return {
            it: {k: v for k, v in r.items() if k != "html"} for it, r in res["iterations"].items()
        }

    assert strip(parallel) == strip(serial) and list(parallel["iterations"]) == ["1", "2", "3"]
    kept = sorted(p.name for p in tmp_path.glob("*.html"))
    assert kept == sorted(p.name for p in out_dir.glob("*.html"))


def test_runs_reported_together_equal_runs_reported_one_by_one(tmp_path: Path):
    real = real_transitions()
    runs = {
        "a": [*as_synthetic(real, 1), *shifted(real, 2)],
        "b": [*as_synthetic(real, 1), *as_synthetic(real, 2), *shifted(real, 3)],
    }
    calls: list[int] = []

    def one_pool(fn, jobs):  # what the stage passes: every report in one call
        calls.append(len(jobs))
        return [fn(*job) for job in jobs]

    together = drift_by_run(real, runs, CFG, tmp_path / "together", run_jobs=one_pool)
    assert calls == [5]
    for name, synthetic in runs.items():
        alone = drift_by_iteration(real, synthetic, CFG, tmp_path / "alone" / name)
        for it, r in alone["iterations"].items():
            t = together[name]["iterations"][it]
            assert {k: v for k, v in t.items() if k != "html"} == {
                k: v for k, v in r.items() if k != "html"
            }
            assert (t["html"] is None) == (r["html"] is None)
        assert together[name]["drifted"] == alone["drifted"]
    assert (tmp_path / "together" / "b" / "drift_iter3.html").is_file()


def test_the_real_side_is_embedded_and_decomposed_once_per_run(tmp_path: Path, monkeypatch):
    import components.evaluation.drift as drift

    real = real_transitions()
    runs = {"a": [*as_synthetic(real, 1), *shifted(real, 2)], "b": as_synthetic(real, 1)}
    svd = np.linalg.svd
    calls: list[tuple[int, ...]] = []

    def counted(a, *args, **kwargs):
        calls.append(a.shape)
        return svd(a, *args, **kwargs)

    monkeypatch.setattr(drift.np.linalg, "svd", counted)
    res = drift_by_run(real, runs, CFG, tmp_path)
    assert len(calls) == 1  # three reports, one basis
    features = res["a"]["iterations"]["2"]["features"]
    assert {"emb_dist", "emb_pc1", "emb_pc2"} <= set(features)
