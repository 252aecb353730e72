"""Evaluation of a policy on held-out real tasks: success rate with a 95% Wilson interval.

Each (task, seed) is one episode in a real env, stepped in lockstep with up to
``parallel`` other episodes so the policy answers all live episodes in one batched call.
A malformed answer is not retried: the env receives ``MALFORMED_ACTION`` (an unknown
verb), takes its invalid-action path and the step counts, as in training. Every
``env.step`` of evaluation is counted in ``eval_real_steps``, apart from the real steps
a method used for training (which the training stage records).

With greedy decoding a deterministic env (TextWorld) replays the same episodes for every
seed, so only the first seed is run; several seeds need ``temperature > 0``. Episodes of
the same task under different seeds are correlated, so the pooled interval is optimistic
when there are few tasks; per-seed rates are reported next to it.

Any object with ``act(observations) -> answers`` plugs in (``Policy``): the batched
``TransformersPolicy`` below for saved SFT/DPO/RL models, or the RL helper's PolicyModel
(its ``ActResult`` has the ``action`` and ``malformed`` an answer needs).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from components.agent.policy import (
    ACTION_STOP,
    MalformedActionError,
    Observation,
    PolicySettings,
    parse_answer,
    render_prompt,
)
from components.agent.policy_base import MALFORMED_ACTION
from components.envs.base import ADMISSIBLE, VALID, Env, EnvError, step_won
from components.evaluation.fidelity import wilson_interval
from components.schema import Task

log = logging.getLogger(__name__)
# evaluation pass p of training seed s samples with seed s + stride x p: no two collide
PASS_SEED_STRIDE = 1000

TEST_SPLIT = "test"


class Answer(Protocol):
    """One decision of a policy: the action sent to the env, and whether it was malformed."""

    @property
    def action(self) -> str: ...

    @property
    def malformed(self) -> bool: ...


class Policy(Protocol):
    """Anything that answers a batch of observations, one answer each, in order."""

    def act(self, observations: Sequence[Observation]) -> Sequence[Answer]:
        """One answer per observation."""
        ...


@dataclass(frozen=True)
class ParsedAnswer:
    """A generated answer after the strict parser."""

    text: str
    action: str  # MALFORMED_ACTION when the answer is malformed
    error: str | None = None  # why it is malformed

    @property
    def malformed(self) -> bool:
        """The answer did not follow the format."""
        return self.error is not None


def parse(text: str, with_reasoning: bool) -> ParsedAnswer:
    """The strict parse of one generated answer (never raises)."""
    try:
        return ParsedAnswer(text, parse_answer(text, with_reasoning).action)
    except MalformedActionError as err:
        return ParsedAnswer(text, MALFORMED_ACTION, str(err))


class TransformersPolicy:
    """A saved causal LM answering in the policy format, batched (greedy by default)."""

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        settings: PolicySettings,
        *,
        max_new_tokens: int = 64,
        temperature: float = 0.0,
        batch_size: int = 16,
    ) -> None:
        from components.lm.generate import Generator

        self.generator = Generator(model, tokenizer)
        self.settings = settings
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.batch_size = batch_size

    @classmethod
    def from_dir(cls, path: Path, **kw: Any) -> TransformersPolicy:
        """A saved policy directory (weights, tokenizer, policy_settings.json)."""
        from components.agent.baselines import load_settings
        from components.lm.models import load_pretrained_dir

        settings = load_settings(Path(path))
        model, tokenizer = load_pretrained_dir(Path(path))
        return cls(model, tokenizer, settings, **kw)

    def act(self, observations: Sequence[Observation]) -> list[ParsedAnswer]:
        """Generate (stopping at ``</action>``) and parse one answer per observation."""
        prompts = [render_prompt(o, self.settings) for o in observations]
        texts = self.generator.generate(
            prompts,
            max_new_tokens=self.max_new_tokens,
            temperature=self.temperature,
            stop=(ACTION_STOP,),
            batch_size=self.batch_size,
        )
        return [parse(t, self.settings.with_reasoning) for t in texts]


@dataclass(frozen=True)
class EpisodeRecord:
    """One evaluation episode."""

    task_id: str
    seed: int
    success: bool
    steps: int  # real env steps taken
    malformed: int  # decisions whose answer was malformed
    invalid: int  # steps whose action the env rejected (malformed ones included)
    truncated: bool
    env_error: str | None = None
    actions: tuple[str, ...] = ()


def episode_rows(
    method: str, mode: str, seed: int, p: int, records: Sequence[EpisodeRecord]
) -> list[dict[str, Any]]:
    """Rows of evaluation episodes (``data/eval/<method>.jsonl``, evaluate-external's)."""
    return [
        {
            "method": method,
            "mode": mode,
            "seed": seed,
            "pass": p,
            "task_id": r.task_id,
            "success": int(r.success),
            "steps": r.steps,
            "invalid": r.invalid,
            "malformed": r.malformed,
            "truncated": int(r.truncated),
            "env_error": r.env_error,
        }
        for r in records
    ]


@dataclass
class LiveEpisode:
    """An episode in progress: what the policy sees next and what it has done."""

    task: Task
    seed: int
    env: Env
    seen: Observation  # the next decision's input (as sft_data.observation_at offline)
    actions: list[str] = field(default_factory=list)
    malformed: int = 0
    invalid: int = 0

    def record(self, success: bool, truncated: bool, error: str | None = None) -> EpisodeRecord:
        """The finished episode."""
        return EpisodeRecord(
            task_id=self.task.task_id,
            seed=self.seed,
            success=success,
            steps=len(self.actions),
            malformed=self.malformed,
            invalid=self.invalid,
            truncated=truncated,
            env_error=error,
            actions=tuple(self.actions),
        )


def run_episodes(
    policy: Policy,
    tasks: Sequence[Task],
    make_env: Callable[[], Env],
    *,
    seed: int = 0,
    parallel: int = 8,
    desc: str | None = None,
) -> list[EpisodeRecord]:
    """One episode per task, ``parallel`` at a time in lockstep; records in task order.

    ``desc``: a progress bar of that name on stderr (a terminal only; none without it).
    """
    from components.progress import progress_bar

    # disable=None: drawn only on a terminal (the caller logs a line per run)
    bar = progress_bar(
        total=len(tasks),
        desc=desc,
        unit="ep",
        leave=False,
        mininterval=2.0,
        disable=None if desc else True,
    )
    envs: list[Env] = []
    pending = list(enumerate(tasks))
    live: dict[int, tuple[int, LiveEpisode]] = {}  # env slot -> (task index, episode)
    done: dict[int, EpisodeRecord] = {}
    try:
        # inside the try: a failure building the third env closes the first two
        envs.extend(make_env() for _ in range(max(1, min(parallel, len(tasks)))))
        free = list(range(len(envs)))
        while pending or live:
            while pending and free:
                index, task = pending.pop(0)
                slot = free.pop()
                episode = start_episode(task, seed, envs[slot])
                if isinstance(episode, EpisodeRecord):
                    done[index] = episode
                    free.append(slot)
                else:
                    live[slot] = (index, episode)
            if not live:
                continue
            slots = sorted(live)
            answers = policy.act([live[s][1].seen for s in slots])
            for slot, answer in zip(slots, answers, strict=True):
                index, episode = live[slot]
                finished = apply_answer(episode, answer)
                if finished is not None:
                    done[index] = finished
                    del live[slot]
                    free.append(slot)
            bar.update(len(done) - bar.n)
    finally:
        bar.close()
        for env in envs:
            env.close()
    return [done[i] for i in range(len(tasks))]


def start_episode(task: Task, seed: int, env: Env) -> LiveEpisode | EpisodeRecord:
    """Reset ``env`` on ``task``; a failed record (no steps) if the env cannot start."""
    try:
        obs, info = env.reset(task, seed=seed)
    except EnvError as err:
        log.warning("reset failed on %s: %s", task.task_id, err)
        env.close()
        return EpisodeRecord(task.task_id, seed, False, 0, 0, 0, False, str(err))
    admissible = info.get(ADMISSIBLE)
    seen = Observation(
        task.instruction,
        obs,
        admissible=tuple(admissible) if admissible else None,
        initial_state=obs,
    )
    return LiveEpisode(task, seed, env, seen)


def apply_answer(episode: LiveEpisode, answer: Answer) -> EpisodeRecord | None:
    """Apply one answer; the finished episode's record, or None while it goes on."""
    episode.malformed += int(answer.malformed)
    episode.actions.append(answer.action)
    try:
        obs, reward, terminated, truncated, info = episode.env.step(answer.action)
    except EnvError as err:
        log.warning("env error on %s: %s", episode.task.task_id, err)
        episode.env.close()
        return episode.record(success=False, truncated=False, error=str(err))
    episode.invalid += int(not info.get(VALID, True))
    if terminated or truncated:
        won = step_won(info, float(reward))
        return episode.record(success=won, truncated=truncated and not terminated)
    episode.seen = episode.seen.then(answer.action, obs, info.get(ADMISSIBLE))
    return None


@dataclass(frozen=True)
class EvalResult:
    """Episodes of one policy over the test tasks and the seeds that were run."""

    episodes: list[EpisodeRecord]
    seeds: tuple[int, ...]
    seeds_requested: tuple[int, ...]
    seconds: float

    def summary(self) -> dict[str, Any]:
        """Success with a 95% Wilson interval, per-seed rates and the real-step accounting."""
        n = len(self.episodes)
        wins = sum(e.success for e in self.episodes)
        low, high = wilson_interval(wins, n)
        decisions = sum(e.steps for e in self.episodes)
        malformed = sum(e.malformed for e in self.episodes)
        per_seed: dict[str, dict[str, Any]] = {}  # keyed by seed: DVC metrics skip lists
        for s in self.seeds:
            eps = [e for e in self.episodes if e.seed == s]
            k = sum(e.success for e in eps)
            per_seed[str(s)] = {"episodes": len(eps), "successes": k, "success": _rate(k, len(eps))}
        return {
            "success": _rate(wins, n),
            "ci_low": low,
            "ci_high": high,
            "episodes": n,
            "successes": wins,
            "tasks": len({e.task_id for e in self.episodes}),
            "seeds": len(self.seeds),
            "seeds_requested": len(self.seeds_requested),
            "per_seed": per_seed,
            "eval_real_steps": decisions,
            "malformed": malformed,
            "malformed_rate": _rate(malformed, decisions),
            "invalid_actions": sum(e.invalid for e in self.episodes),
            "truncated": sum(e.truncated for e in self.episodes),
            "env_errors": sum(e.env_error is not None for e in self.episodes),
            "mean_episode_steps": _rate(decisions, n),
            "eval_seconds": round(self.seconds, 2),
        }

    def rows(self) -> list[dict[str, Any]]:
        """One plain row per episode (for an MLflow table)."""
        return [{**asdict(e), "actions": json.dumps(e.actions)} for e in self.episodes]


def _rate(k: float, n: int) -> float:
    return k / n if n else 0.0


def evaluate(
    policy: Policy,
    tasks: Sequence[Task],
    make_env: Callable[[], Env],
    *,
    seeds: Sequence[int] = (0,),
    greedy: bool = True,
    parallel: int = 8,
) -> EvalResult:
    """Run every task once per seed (only the first seed when ``greedy``)."""
    import torch

    if not tasks:
        raise ValueError("no tasks to evaluate on")
    run = tuple(seeds[:1]) if greedy else tuple(seeds)
    if greedy and len(seeds) > 1:
        log.info("greedy decoding: seeds %s would replay seed %d's episodes", seeds[1:], seeds[0])
    start = time.perf_counter()
    episodes: list[EpisodeRecord] = []
    for seed in run:
        torch.manual_seed(seed)  # sampling policies draw from torch's generator
        episodes += run_episodes(policy, tasks, make_env, seed=seed, parallel=parallel)
    return EvalResult(episodes, run, tuple(seeds), time.perf_counter() - start)


def held_out_tasks(tasks: Sequence[Task]) -> list[Task]:
    """The held-out tasks (split == "test"), never used for training or tuning."""
    return [t for t in tasks if t.split == TEST_SPLIT]
