"""Task-generation head: strict parsers, SFT examples from real data, variant tasks."""

from __future__ import annotations

from collections import Counter

import pytest

from components.experience.format import MalformedOutputError
from components.experience.task_generation import (
    TASK_SYSTEM_PROMPT,
    generate_variants,
    initial_state_prompt,
    parse_state,
    parse_task,
    render_task,
    task_generation_examples,
    variant_prompt,
)
from components.schema import Task
from tests.synthetic.conftest import episode


def _task(i: int, family: str = "quest", split: str = "train") -> Task:
    return Task(
        task_id=f"tw-{family}-{i:03d}",
        env="textworld",
        family=family,
        difficulty=1,
        split=split,
        instruction=f"Take the item number {i} from the {family} room.",
        seed=i,
        game_file=f"data/tasks/games/tw-{family}-{i:03d}.z8",
    )


def test_parsers_are_strict():
    assert parse_task(render_task("  Open the chest. ")) == "Open the chest."
    assert parse_state(" <state>Location: Hall</state>\n") == "Location: Hall"
    for bad, why in [
        ("Open the chest.", "missing <task>"),
        ("<task>Open the chest.", "unclosed"),
        ("<task>a</task> and more", "outside"),
        ("<task>  </task>", "empty"),
        ("<task>go <state>x</state></task>", "nested"),
    ]:
        with pytest.raises(MalformedOutputError, match=why):
            parse_task(bad)
    with pytest.raises(MalformedOutputError):
        parse_state("<task>x</task>")


def test_prompts_carry_the_family_seed_and_reference():
    seed = _task(1)
    msgs = variant_prompt(seed)
    assert msgs[0]["content"] == TASK_SYSTEM_PROMPT
    assert "Family: quest" in msgs[1]["content"] and seed.instruction in msgs[1]["content"]
    with_ref = initial_state_prompt(seed, "Location: Hall", "quest")[1]["content"]
    assert "Reference initial state" in with_ref and "Location: Hall" in with_ref
    assert "Reference" not in initial_state_prompt(seed, None, "quest")[1]["content"]


def test_examples_come_from_real_train_tasks_of_the_same_family():
    tasks = [_task(i) for i in range(3)] + [_task(i, "cooking") for i in range(2)]
    tasks += [_task(9, split="test"), _task(8).model_copy(update={"generated": True})]
    trajs = [
        episode(2, True, t.task_id, i).model_copy(update={"initial_state": f"Location: {i}"})
        for i, t in enumerate(tasks)
    ]
    examples = task_generation_examples(tasks, trajs, seed=0)
    variants = [e for e in examples if e.kind == "variant"]
    states = [e for e in examples if e.kind == "initial_state"]
    assert len(variants) == 3 * 2 + 2 * 1  # ordered pairs inside each family
    for ex in variants:
        user = ex.messages[1]["content"]
        family = user.split("Family: ")[1].split("\n")[0]
        assert f"the {family} room" in parse_task(ex.answer)
        assert parse_task(ex.answer) not in user  # the variant is another task
    held_out = {"tw-quest-009", "tw-quest-008"}
    assert all(t not in e.messages[1]["content"] + e.answer for e in examples for t in held_out)
    assert len(states) == 5
    for ex in states:
        rec = ex.to_sft()
        assert rec["completion"][0]["role"] == "assistant"
        assert parse_state(rec["completion"][0]["content"]).startswith("Location: ")
        assert "Reference initial state" in rec["prompt"][1]["content"]
    limited = task_generation_examples(tasks, trajs, seed=0, limit=4)
    assert len(limited) == 4 and {e.kind for e in limited} == {"variant", "initial_state"}
    assert [e.id for e in limited] == [e.id for e in task_generation_examples(tasks, trajs, 0, 4)]


def test_generate_variants_builds_generated_tasks():
    seeds = [_task(1), _task(2, "cooking")]
    answers = iter(
        [
            "<task>Put the lamp on the shelf.</task>",
            "garbage",
            "<task>Cook the carrot.</task>",
            "<task>Cook the carrot.</task>",
        ]
    )
    counts: Counter[str] = Counter()
    out = generate_variants(
        lambda prompts: [next(answers) for _ in prompts], seeds, 2, counts=counts
    )
    assert counts == Counter(variants_requested=4, variants_malformed=1)
    assert [t.instruction for t in out] == [
        "Put the lamp on the shelf.",
        "Cook the carrot.",
        "Cook the carrot.",
    ]
    lamp, carrot, carrot2 = out
    assert lamp.generated and lamp.parent_task_id == "tw-quest-001" and lamp.family == "quest"
    assert carrot.family == "cooking" and carrot.split == "train" and carrot.game_file is None
    assert carrot.task_id == carrot2.task_id and carrot.task_id.startswith("gen-cooking-")
    assert lamp.task_id != carrot.task_id
    assert generate_variants(lambda p: [], seeds, 0) == []


def test_a_variant_of_a_task_whose_family_is_a_path_gets_a_file_safe_id():
    # a user's games may name a family "ifdb/zork": the variant id (gen-<family>-<key>)
    # failed the task_id check and ended the DreamGym run at its first generation round
    from components.experience.task_generation import generated_task
    from tests.factories import make_task

    parent = make_task("ext-zork-1234abcd").model_copy(update={"family": "ifdb/zork"})
    variant = generated_task(parent, "Find the lamp.")
    assert variant.task_id.startswith("gen-ifdb-zork-") and variant.family == "ifdb/zork"
