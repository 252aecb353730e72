"""Co-evolution: synthetic rollouts join a real LanceDB buffer and later retrieval sees them."""

from __future__ import annotations

import pytest

from components.buffer.embedders import embed_text
from components.config import AblationConfig, BufferConfig, SyntheticEnvConfig
from components.envs.vector import VectorEnv
from components.experience.coevolution import (
    append_iteration,
    coevolution_enabled,
    fork_seed_buffer,
    iteration_tag,
)
from components.experience.dataset import buffer_retriever
from components.experience.synthetic_env import VectorSyntheticEnv
from tests.synthetic.conftest import SETTINGS, answer_for, episode, synthetic_transition

ATTIC = "Location: Attic\nA dusty trunk.\nInventory: a brass lamp\nFeedback: You climb up."


def _rollouts(buf, index, tasks, seen):
    def generate(prompts):
        seen.extend(p[1]["content"] for p in prompts)
        return [answer_for(ATTIC)] * len(prompts)

    venv = VectorSyntheticEnv(
        generate,
        index,
        cfg=SyntheticEnvConfig(max_steps=2),
        prompt=SETTINGS,
        retriever=buffer_retriever(buf, env="textworld"),
    )
    assert isinstance(venv, VectorEnv)  # the contract rollouts drive (components/envs/vector.py)
    venv.reset(tasks)
    while not venv.done:
        venv.step(["climb ladder"] * len(tasks))
    assert venv.real_steps == 0
    return venv


def test_buffer_grows_with_provenance_and_retrieval_sees_new_rows(seed_buffer, index, tasks):
    buf = seed_buffer
    n_seed = len(buf)
    seen: list[str] = []
    venv = _rollouts(buf, index, tasks, seen)
    assert "Similar past transitions:" in seen[0] and ATTIC not in seen[0]
    trajs = venv.trajectories(policy="grpo", iteration=1, checkpoint="ckpt-1")
    result = append_iteration(buf, trajs, 1)
    n_new = sum(t.n_steps for t in trajs)
    assert result.inserted == n_new == 4 and result.rows == n_seed + n_new
    assert result.rows_synthetic == n_new and result.tag == iteration_tag(1) == "iter-1"
    assert buf.tags()["iter-1"] == buf.version
    stored = buf.get([s.id for t in trajs for s in t.steps])
    assert {(s.source, s.provenance.iteration, s.provenance.checkpoint) for s in stored} == {
        ("synthetic", 1, "ckpt-1")
    }
    # the next iteration's retrieval grounds on the synthetic rows it has just written
    hits = buf.retrieve(embed_text(tasks[0].instruction, ATTIC, "climb ladder"), 1)
    assert hits[0][0].source == "synthetic" and hits[0][0].provenance.iteration == 1
    seen.clear()
    _rollouts(buf, index, tasks, seen)
    assert ATTIC in seen[-1].split("Similar past transitions:")[1].split("Recent history:")[0]
    # idempotent: re-appending the same iteration writes nothing, the tag stays put
    again = append_iteration(buf, trajs, 1)
    assert again.inserted == 0 and again.version == result.version
    # the seed version is still there to replay against
    buf.checkout("seed")
    assert len(buf) == n_seed
    buf.checkout_latest()


def test_append_rejects_unstamped_or_real_experience(seed_buffer, index, tasks):
    venv = _rollouts(seed_buffer, index, tasks, [])
    wrong = venv.trajectories(policy="grpo", iteration=2)
    with pytest.raises(ValueError, match="iteration 2"):
        append_iteration(seed_buffer, wrong, 3)
    with pytest.raises(ValueError, match="only synthetic"):
        append_iteration(seed_buffer, [episode(2, True, "tw-quest-0", 77)], 3)


def test_fork_keeps_the_seed_buffer_untouched(seed_buffer, tmp_path, wordllama):
    work = fork_seed_buffer(
        seed_buffer.path,
        tmp_path / "work",
        BufferConfig(embedder="wordllama"),
        embedder=wordllama,
    )
    assert len(work) == len(seed_buffer) and "seed" in work.tags()
    append_iteration(work, [], 0)  # an empty iteration still tags its version
    work.add([synthetic_transition(0, 1)])
    seed_buffer.refresh()
    assert len(work) == len(seed_buffer) + 1
    assert coevolution_enabled(AblationConfig()) and not coevolution_enabled(
        AblationConfig(no_replay=True)
    )
