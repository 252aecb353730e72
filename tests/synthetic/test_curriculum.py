"""Curriculum: variance, seed selection, lambda mixing, filtering, k-means groups."""

from __future__ import annotations

import json

import numpy as np
import pytest

from components.config import CurriculumConfig
from components.curriculum import (
    Curriculum,
    Rollout,
    cluster_groups,
    filter_generated,
    group_stats,
    kmeans,
    mix_batch,
    n_generated_slots,
    reward_variance,
    select_seeds,
    variance_histogram,
)
from components.curriculum.clusters import assign_clusters
from components.curriculum.curriculum import variant_seed
from components.curriculum.selection import subsample_tasks
from components.experience.task_generation import generated_task
from components.schema import Task
from tests.factories import make_task


def _task(tid: str, text: str, family: str = "quest") -> Task:
    return Task(
        task_id=tid,
        env="textworld",
        family=family,
        difficulty=1,
        split="train",
        instruction=text,
        seed=0,
    )


def _rollouts(successes: dict[str, int], n: int = 8) -> list[Rollout]:
    return [Rollout(t, float(i < k)) for t, k in successes.items() for i in range(n)]


def test_variance_selection_prefers_half_success_tasks():
    stats = group_stats(_rollouts({"never": 0, "always": 8, "half": 4, "some": 2}))
    assert stats["half"].variance == pytest.approx(0.25)
    assert stats["never"].variance == stats["always"].variance == 0.0
    assert select_seeds(stats, 1) == ["half"]
    assert select_seeds(stats, 5) == ["half", "some"]  # zero-variance tasks never seed
    assert select_seeds(stats, 5, min_variance=0.2) == ["half"]
    assert reward_variance([]) == 0.0 and reward_variance([1, 0]) == 0.25
    hist = variance_histogram([s.variance for s in stats.values()], 5)
    assert sum(hist.values()) == 4 and hist["0.000"] == 2 and hist["0.200"] == 1


def test_the_most_variance_bins_the_config_allows_keep_distinct_keys():
    from pydantic import ValidationError

    from components.config import CurriculumConfig

    most = CurriculumConfig.model_fields["variance_bins"].metadata
    bins = next(m.le for m in most if hasattr(m, "le"))
    assert len(variance_histogram([0.1], bins)) == bins  # keys at 3 decimals: none merged
    with pytest.raises(ValidationError):
        CurriculumConfig(variance_bins=bins + 1)


@pytest.mark.parametrize(
    ("batch", "lam", "n_gen_available", "expected"),
    [
        (16, 0.25, 10, 4),
        (10, 0.3, 10, 3),
        (7, 0.5, 10, 3),
        (8, 0.25, 1, 1),
        (8, 0.0, 5, 0),
        (5, 1.0, 9, 5),
        (3, 0.1, 9, 0),
    ],
)
def test_lambda_caps_the_generated_share_exactly(batch, lam, n_gen_available, expected):
    real = [_task(f"r{i}", f"real task {i}") for i in range(6)]
    gen = [
        _task(f"g{i}", f"generated task {i}").model_copy(update={"generated": True})
        for i in range(n_gen_available)
    ]
    tasks = mix_batch(real, gen, batch, lam, seed=1)
    assert len(tasks) == batch
    assert (
        sum(t.generated for t in tasks)
        == expected
        == min(n_generated_slots(batch, lam), n_gen_available)
    )
    assert tasks == mix_batch(real, gen, batch, lam, seed=1)  # seeded
    with pytest.raises(ValueError):
        mix_batch([], gen, batch, lam, seed=1)


def test_generated_tasks_are_deduplicated_and_well_formed():
    parent = _task("tw-quest-001", "Take the lamp from the shelf.")
    other = _task("tw-quest-002", "Open the red chest in the attic.")
    texts = [
        "Put the lamp on the table.",  # fine
        "put the LAMP on the table!",  # same after normalisation
        "Open the red chest in the attic",  # an existing task
        "Take the lamp from the shelf",  # the parent itself
        "Go.",  # too short
        "x" * 500,  # too long
        "Open the\x00 drawer now.",  # unprintable
    ]
    cands = [generated_task(parent, t) for t in texts]
    kept, rejected = filter_generated(cands, [parent, other], min_chars=8, max_chars=200)
    assert [t.instruction for t in kept] == ["Put the lamp on the table."]
    assert rejected == {
        "duplicate": 1,
        "existing_task": 1,
        "same_as_parent": 1,
        "too_short": 1,
        "too_long": 1,
        "unprintable": 1,
    }
    orphan = generated_task(parent, "Light the lamp.").model_copy(update={"parent_task_id": "?"})
    assert filter_generated([orphan], [other], min_chars=1, max_chars=99)[1] == {"no_parent": 1}


def test_kmeans_separates_blobs_and_is_seeded():
    rng = np.random.default_rng(0)
    centres = np.array([[5.0, 0, 0], [0, 5.0, 0], [0, 0, 5.0]])
    x = np.concatenate([c + 0.1 * rng.standard_normal((10, 3)) for c in centres])
    labels, cents = kmeans(x, 3, seed=0)
    groups = [set(labels[i * 10 : (i + 1) * 10]) for i in range(3)]
    assert all(len(g) == 1 for g in groups) and len(set.union(*groups)) == 3
    assert np.array_equal(labels, kmeans(x, 3, seed=0)[0]) and cents.shape == (3, 3)
    assert kmeans(x[:2], 5)[1].shape[0] == 2  # k capped at the distinct points


def test_task_clusters_group_by_meaning(wordllama):
    tasks = [
        _task(f"c{i}", t)
        for i, t in enumerate(
            [
                "Cook the carrot and eat the meal.",
                "Slice the carrot, fry it and eat the meal.",
                "Roast the potato and eat the meal.",
                "Find the brass key and unlock the chest.",
                "Unlock the chest with the iron key.",
                "Find the golden key and unlock the wooden chest.",
            ]
        )
    ]
    assignment = assign_clusters(tasks, wordllama, k=2, seed=0)
    assert sorted(cluster_groups(assignment)) == [["c0", "c1", "c2"], ["c3", "c4", "c5"]]


def _fake_variants(prompts, iteration):
    # a task-generation backend: one new variant text per request (a plain callable)
    return [
        f"<task>Variant {i} of: {p[1]['content'].split('Seed task: ')[1]}</task>"
        for i, p in enumerate(prompts)
    ]


def test_curriculum_iteration_generates_seeds_variants_and_respects_lambda():
    real = [_task(f"tw-quest-{i}", f"Take item {i} from the box.") for i in range(6)]
    cfg = CurriculumConfig(
        batch_size=8,
        lambda_generated=0.25,
        seeds_per_iteration=2,
        variants_per_seed=2,
        min_task_chars=5,
    )
    cur = Curriculum(real, cfg, generate_fn=_fake_variants)
    first = cur.first_batch()
    assert len(first.tasks) == 8 and not any(t.generated for t in first.tasks)
    rollouts = _rollouts({"tw-quest-0": 4, "tw-quest-1": 0, "tw-quest-2": 8, "tw-quest-3": 3})
    batch = cur.next_batch(rollouts, iteration=1)
    assert batch.seeds == ["tw-quest-0", "tw-quest-3"]
    assert len(batch.new_generated) == 4 and {t.parent_task_id for t in batch.new_generated} == {
        "tw-quest-0",
        "tw-quest-3",
    }
    assert sum(t.generated for t in batch.tasks) == 2 and batch.metrics["share_generated"] == 0.25
    assert batch.metrics["success_real"] == pytest.approx(15 / 32)
    assert batch.metrics["success_seed_tasks"] == pytest.approx(7 / 16)
    assert batch.metrics["variants_requested"] == 4 and sum(batch.variance_histogram.values()) == 4
    gen_id = batch.new_generated[0].task_id
    nxt = cur.next_batch(_rollouts({gen_id: 2, "tw-quest-0": 8}), iteration=2)
    assert nxt.metrics["success_generated"] == 0.25 and nxt.seeds == [gen_id]
    # a variant of a variant: its parent is the real game the first variant came from
    assert nxt.new_generated[0].parent_task_id == batch.new_generated[0].parent_task_id
    # ablation: no task generation -> real tasks only
    off = Curriculum(real, cfg, generate_fn=_fake_variants, task_generation=False)
    plain = off.next_batch(rollouts, iteration=1)
    assert not plain.new_generated and not any(t.generated for t in plain.tasks)


def test_a_seed_task_picked_again_gets_new_variants_in_a_later_round():
    # a sampling backend is deterministic in its seed: one seed for every round would
    # repeat a seed task's variants, all rejected as duplicates of the first round's
    real = [_task(f"tw-quest-{i}", f"Take item {i} from the box.") for i in range(4)]
    cfg = CurriculumConfig(batch_size=4, seeds_per_iteration=1, variants_per_seed=2)
    asked: list[int] = []

    def sampled(prompts, iteration):
        seed = variant_seed(cfg.seed, 0, iteration)
        asked.append(iteration)
        return [
            f"<task>Take item {seed % 997}-{i} from the crate.</task>" for i in range(len(prompts))
        ]

    cur = Curriculum(real, cfg, generate_fn=sampled)
    rollouts = _rollouts({"tw-quest-0": 4})
    first = cur.next_batch(rollouts, iteration=1)
    again = cur.next_batch(rollouts, iteration=2)
    assert asked == [1, 2] and first.seeds == again.seeds == ["tw-quest-0"]
    assert len(again.new_generated) == 2
    assert not any(v for k, v in again.metrics.items() if k.startswith("rejected"))
    assert variant_seed(0, 0, 1) != variant_seed(0, 0, 2) != variant_seed(0, 1, 2)


def test_ppo_groups_are_clusters(wordllama):
    real = [
        _task("a1", "Cook the carrot and eat the meal."),
        _task("a2", "Slice the carrot, fry it and eat the meal."),
        _task("b1", "Find the brass key and unlock the chest."),
        _task("b2", "Unlock the chest with the iron key."),
    ]
    cfg = CurriculumConfig(batch_size=4, n_clusters=2, seeds_per_iteration=1)
    cur = Curriculum(real, cfg, group_by="cluster", embedder=wordllama)
    # each task alone has zero variance; the cooking cluster mixes success and failure
    stats = cur.task_stats(_rollouts({"a1": 8, "a2": 0, "b1": 0, "b2": 0}))
    assert stats["a1"].variance == stats["a2"].variance == pytest.approx(0.25)
    assert stats["b1"].variance == 0.0
    with pytest.raises(ValueError, match="embedder"):
        Curriculum(real, cfg, group_by="cluster")


def test_frontier_order_retires_tied_variants_and_gives_their_slots_to_real_tasks():
    real = [_task(f"tw-quest-{i}", f"Take item {i} from the box.") for i in range(6)]
    cfg = CurriculumConfig(
        batch_size=8,
        lambda_generated=0.5,
        seeds_per_iteration=2,
        variants_per_seed=2,
        min_task_chars=5,
        generated_order="frontier",
    )
    cur = Curriculum(real, cfg, generate_fn=_fake_variants)
    first = cur.next_batch(_rollouts({"tw-quest-0": 4, "tw-quest-3": 3}), iteration=1)
    a, b, c, d = (t.task_id for t in first.new_generated)
    # a mixed, b all lost, c all won, d not played: a first, then the new ones, then d
    batch = cur.next_batch(_rollouts({a: 3, b: 0, c: 8, "tw-quest-0": 8}), iteration=2)
    ids = [t.task_id for t in cur.generated]
    assert ids[0] == a and ids[-1] == d and ids[1:-1] == [t.task_id for t in batch.new_generated]
    assert {t.task_id for t in cur.retired} == {b, c}
    assert batch.metrics["n_generated_retired"] == 2
    assert not {b, c} & {t.task_id for t in batch.tasks}
    # a retired task stays known (stats, dedup) but never comes back
    assert {b, c} <= set(cur.tasks_by_id)
    later = cur.next_batch(_rollouts({a: 0}), iteration=3)
    assert a in {t.task_id for t in cur.retired}
    assert not {a, b, c} & {t.task_id for t in later.tasks}
    # with no eligible generated task left, the whole batch is real
    cur.generated = []
    assert not any(t.generated for t in cur.next_batch([], iteration=4).tasks)


def test_a_restored_curriculum_picks_the_same_next_batch():
    real = [_task(f"tw-quest-{i}", f"Take item {i} from the box.") for i in range(6)]
    cfg = CurriculumConfig(
        batch_size=8, lambda_generated=0.5, min_task_chars=5, generated_order="frontier"
    )
    cur = Curriculum(real, cfg, generate_fn=_fake_variants)
    first = cur.next_batch(_rollouts({"tw-quest-0": 4, "tw-quest-3": 3}), iteration=1)
    a, b = (t.task_id for t in first.new_generated[:2])
    cur.next_batch(_rollouts({a: 3, b: 0}), iteration=2)
    state = json.loads(json.dumps(cur.state_dict()))
    fresh = Curriculum(real, cfg, generate_fn=_fake_variants)
    fresh.load_state_dict(state)
    rollouts = _rollouts({a: 8, "tw-quest-1": 5})
    want = cur.next_batch(rollouts, iteration=3)
    got = fresh.next_batch(rollouts, iteration=3)
    assert [t.task_id for t in got.tasks] == [t.task_id for t in want.tasks]
    assert [t.task_id for t in fresh.retired] == [t.task_id for t in cur.retired]


def test_subsample_tasks_is_fixed_and_order_independent():
    tasks = [_task(f"tw-quest-{i}", f"Take item {i} from the box.") for i in range(20)]
    some = subsample_tasks(tasks, 5)
    assert len({t.task_id for t in some}) == 5
    assert [t.task_id for t in subsample_tasks(tasks[::-1], 5)] == [t.task_id for t in some]
    assert subsample_tasks(tasks, 0) == tasks and subsample_tasks(tasks, 99) == tasks


def test_training_seeds_do_not_share_batches_shifted_by_a_round():
    """The curriculum seed is curriculum.seed + training seed: seed s's round i must not
    replay seed s+1's round i-1 (the seeds' CIs assume independent runs)."""
    real = [make_task(f"t{i}", f"do thing {i}", i) for i in range(40)]

    def batches(seed: int) -> list[list[str]]:
        cfg = CurriculumConfig().model_copy(update={"batch_size": 8, "seed": seed})
        cur = Curriculum(real, cfg, task_generation=False)
        out = [[t.task_id for t in cur.first_batch().tasks]]
        for i in range(1, 3):
            rollouts = [Rollout(t, 0.0) for t in out[-1]]
            out.append([t.task_id for t in cur.next_batch(rollouts, i).tasks])
        return out

    s0, s1 = batches(0), batches(1)
    assert s0 == batches(0)  # still deterministic
    assert s0[1] != s1[0] and s0[2] != s1[1]
