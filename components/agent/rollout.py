"""Multi-turn rollouts of the policy on any environment with the common interface.

One loop serves real and synthetic environments through the one batched contract,
``VectorEnv`` (components/envs/vector.py):

    venv.reset(tasks) -> list[(observation, info)]            one slot per task
    venv.step(actions) -> list[(obs, reward, terminated, truncated, info) | None]
                                                               one action per slot, None for
                                                               finished slots (they return None)
    venv.active -> list[bool]                                  slots still running
    venv.real_steps -> int                                     real interactions (0: synthetic)

``EnvList`` (same module) puts ordinary ``Env`` instances (e.g. real TextWorld games)
behind it and counts every real step; the synthetic envs (``GroundedVectorEnv``,
``VectorSyntheticEnv``) implement it directly and count 0.

Each turn records what the policy saw and produced: the prompt token ids (the rendered
task, history, state and admissible actions, i.e. environment text: never trained on),
the completion token ids (the only tokens that get a loss) and their log-probabilities at
sampling time. The episode's outcome reward is the sum of its step rewards (0/1 outcome
rewards: 1 only when the task was completed).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from components.agent.policy import Observation
from components.agent.policy_base import ActResult, TrainablePolicy
from components.envs.base import ADMISSIBLE, VALID, step_won
from components.envs.vector import ENV_ERROR, VectorEnv
from components.episodes import task_trajectory, task_transition
from components.schema import Provenance, Source, Task, Trajectory, stable_id


@dataclass
class Turn:
    """One decision of an episode and the env's answer."""

    observation: Observation  # what the policy saw
    act: ActResult  # prompt/completion ids, old log-probs, the action sent
    reward: float
    next_state: str
    valid: bool
    done: bool
    won: bool = False  # the env's won flag (with env.reward = score a reward is not a win)


@dataclass
class Episode:
    """One rollout: the task, its turns and how it ended."""

    task: Task
    group: int  # episodes with the same group share an advantage baseline (GRPO)
    initial_state: str
    turns: list[Turn] = field(default_factory=list)
    terminated: bool = False
    truncated: bool = False
    won: bool = False
    env_error: str | None = None

    @property
    def reward(self) -> float:
        """Outcome reward: the sum of step rewards."""
        return float(sum(t.reward for t in self.turns))

    @property
    def success(self) -> bool:
        """The task was completed (the env's won flag, never a partial score)."""
        return self.won

    @property
    def n_malformed(self) -> int:
        """Turns whose answer was malformed."""
        return sum(t.act.malformed for t in self.turns)

    def to_trajectory(
        self,
        *,
        source: Source,
        policy: str,
        iteration: int = 0,
        checkpoint: str | None = None,
        index: int = 0,
    ) -> Trajectory | None:
        """The episode as a schema Trajectory (None when it has no turns)."""
        if not self.turns:
            return None
        episode_id = stable_id(source, policy, iteration, checkpoint, index, self.task.task_id)
        state = self.initial_state
        steps = []
        for i, t in enumerate(self.turns):
            steps.append(
                task_transition(
                    self.task,
                    episode_id,
                    i,
                    state,
                    t.act.action,
                    t.next_state,
                    reward=int(t.won),
                    done=t.done,
                    admissible_actions=list(t.observation.admissible)
                    if t.observation.admissible is not None
                    else None,
                    valid_action=t.valid,
                    source=source,
                    provenance=Provenance(
                        policy=policy, iteration=iteration, checkpoint=checkpoint
                    ),
                )
            )
            state = t.next_state
        return task_trajectory(self.task, steps, self.initial_state, truncated=self.truncated)


@dataclass
class RolloutBatch:
    """The episodes of one rollout round and what they cost."""

    episodes: list[Episode]
    real_steps: int  # real env steps taken by this round (0 in a synthetic env)
    seconds: float
    policy_seconds: float  # generation + scoring
    env_seconds: float  # env stepping (real simulator or experience model)

    def metrics(self) -> dict[str, float]:
        """Success, reward, length, malformed rate and costs of the round."""
        eps = self.episodes
        turns = [t for e in eps for t in e.turns]
        n, n_turns = max(1, len(eps)), max(1, len(turns))
        mean = sum(e.reward for e in eps) / n
        return {
            "episodes": float(len(eps)),
            "success_rate": sum(e.success for e in eps) / n,
            "mean_reward": mean,
            "reward_std": (sum((e.reward - mean) ** 2 for e in eps) / n) ** 0.5,
            "mean_turns": len(turns) / n,
            "malformed_rate": sum(t.act.malformed for t in turns) / n_turns,
            "invalid_rate": sum(not t.valid for t in turns) / n_turns,
            "truncated_rate": sum(e.truncated for e in eps) / n,
            "env_errors": float(sum(e.env_error is not None for e in eps)),
            "completion_tokens": float(sum(len(t.act.completion_ids) for t in turns)),
            "real_steps_round": float(self.real_steps),
            "rollout_seconds": self.seconds,
            "policy_seconds": self.policy_seconds,
            "env_seconds": self.env_seconds,
        }


def collect_rollouts(
    policy: TrainablePolicy,
    venv: VectorEnv,
    tasks: Sequence[Task],
    *,
    groups: Sequence[int] | None = None,
    temperature: float = 1.0,
    max_new_tokens: int = 64,
    max_turns: int | None = None,
) -> RolloutBatch:
    """Run one episode per task to the end, all slots advanced together.

    ``max_turns`` is a safety cap on top of the env's own step limit (the episode is then
    marked truncated); normally the env truncates first. A slot cut this way gets ``None``
    actions while others run: EnvList skips it, VectorSyntheticEnv (today) still steps it
    with an empty action, so prefer the env's own ``max_steps``.
    """
    start = time.perf_counter()
    steps_before = venv.real_steps
    groups = list(groups) if groups is not None else list(range(len(tasks)))
    t_env = time.perf_counter()
    first = venv.reset(list(tasks))
    env_seconds = time.perf_counter() - t_env
    live = list(venv.active)
    episodes = [
        Episode(task=t, group=g, initial_state=obs, env_error=info.get(ENV_ERROR))
        for t, g, (obs, info) in zip(tasks, groups, first, strict=True)
    ]
    seen = [
        Observation(t.instruction, obs, admissible=_admissible(info), initial_state=obs)
        for t, (obs, info) in zip(tasks, first, strict=True)
    ]
    policy_seconds = 0.0
    while any(live):
        idx = [i for i, alive in enumerate(live) if alive]
        observations = [seen[i] for i in idx]
        t0 = time.perf_counter()
        acts = policy.act(observations, temperature=temperature, max_new_tokens=max_new_tokens)
        policy_seconds += time.perf_counter() - t0
        actions: list[str | None] = [None] * len(tasks)
        for i, act in zip(idx, acts, strict=True):
            actions[i] = act.action
        t0 = time.perf_counter()
        outs = venv.step(actions)
        env_seconds += time.perf_counter() - t0
        for i, obs_i, act in zip(idx, observations, acts, strict=True):
            out = outs[i]
            if out is None:  # the env had already ended this slot: nothing was applied
                live[i] = False
                continue
            obs, reward, terminated, truncated, info = out
            ep = episodes[i]
            if max_turns is not None and len(ep.turns) + 1 >= max_turns:
                truncated = truncated or not terminated
            done = bool(terminated or truncated)
            valid = bool(info.get(VALID, True)) and not act.malformed
            won = step_won(info, float(reward))
            ep.turns.append(Turn(obs_i, act, float(reward), obs, valid, done, won))
            seen[i] = obs_i.then(act.action, obs, _admissible(info))
            if ENV_ERROR in info:
                ep.env_error = str(info[ENV_ERROR])
            if done:
                live[i] = False
                ep.terminated, ep.truncated = bool(terminated), bool(truncated and not terminated)
                ep.won = won
    return RolloutBatch(
        episodes=episodes,
        real_steps=venv.real_steps - steps_before,
        seconds=time.perf_counter() - start,
        policy_seconds=policy_seconds,
        env_seconds=env_seconds,
    )


def _admissible(info: dict[str, Any]) -> tuple[str, ...] | None:
    actions = info.get(ADMISSIBLE)
    return tuple(actions) if actions else None
