"""The synthetic environment: the trained experience model used as a simulator.

Interface (what agent RL code uses)
-----------------------------------
``GenerateFn = Callable[[list[list[dict[str, str]]]], list[str]]``: one batched call,
chat prompts in, raw completions out, same order. Any backend plugs in through
``generate_fns(backend, cfg)``: ``Generator(model, tokenizer)`` (local transformers,
batched) or ``OpenAIBackend(OpenAIBackendConfig(..., on_failure="empty"))`` (a vLLM /
OpenAI-compatible server, concurrent requests).

``VectorSyntheticEnv`` advances many episodes at once (ONE generate call and ONE
retrieval call per ``step`` for all live episodes)::

    index = RealStateIndex.from_trajectories(train_trajectories)   # initial states etc.
    venv = VectorSyntheticEnv.from_config(cfg, Generator(model, tok), index,
                                          buffer=buf, meta=load_meta(model_dir))
    # or by hand: generate, resample = generate_fns(backend, cfg.synthetic);
    # VectorSyntheticEnv(generate, index, cfg=cfg.synthetic, prompt=settings,
    #                    retriever=buffer_retriever(buf), resample=resample)
    first = venv.reset(tasks)          # list[(obs, info)]; GRPO: repeat a task n times
    while not venv.done:
        actions = [policy(obs) if live else None for ...]     # one per slot
        outs = venv.step(actions)      # list[StepOutput | None]; None = slot finished earlier
        for i, out in enumerate(outs):
            if out is not None:
                obs, reward, terminated, truncated, info = out
    trajs = venv.trajectories(policy="grpo", iteration=it, checkpoint="ckpt-3")
    venv.metrics()                     # counts and seconds (generation, retrieval, parsing)

``SyntheticEnv`` is the same engine with one slot and implements the ``Env`` protocol of
``components/envs/base.py`` (``reset(task) -> (obs, info)``, ``step(action) -> 5-tuple``),
so code written for the real envs runs unchanged.

Semantics
- reset: a known task starts from its real initial observation
  (``RealStateIndex.initial_states``, built from the ingested trajectories or any mapping
  task_id -> state). A generated task (``Task.generated``) gets an initial state written by
  the experience model's task-generation head, given the parent's real initial state as
  reference; it is cached per task_id so all rollouts of a group start from the same state.
  If that answer is malformed twice, the parent's initial state is used (counted in
  ``n_init_fallback``); without a parent the episode starts finished (``info[MALFORMED]``).
- step: the prompt is ``format.render_prompt`` of (task, last ``history_len`` steps, state,
  action, k retrieved transitions); the answer ``<think>..</think><state>..</state>
  <reward>r</reward>`` is parsed strictly. A malformed answer is resampled once (with the
  ``resample`` backend, which samples at ``resample_temperature``); if the resample is also
  malformed the episode ends as a failure (reward 0, terminated, ``info[MALFORMED]``).
  Reward 1 terminates (success); ``max_steps`` truncates. Invalid actions get whatever the
  model predicts (it was trained that they leave the state unchanged, reward 0).
- admissible actions (``info[ADMISSIBLE]``): the model cannot enumerate them, so they are
  looked up: the actions a REAL transition recorded at the same world state (the state text
  without its ``Feedback:`` line, whitespace-normalised; the same task's record preferred),
  else ``None`` (a state real data never visited). An exact lookup rather than the nearest
  retrieved neighbour because a neighbour at a *similar* state offers actions on objects the
  current state may not have; ``None`` tells the policy to propose actions freely.
  ``info[VALID]`` is membership in that list when known, else True (unknown).
- episode ids are internal until ``trajectories(iteration=..., checkpoint=...)`` stamps
  them (namespace, iteration, checkpoint, policy, episode counter and a hash of the
  episode's content), so co-evolution iterations never produce colliding transition ids;
  only two identical episodes can share an id, which the buffer then stores once.
- ``restart_finished()`` starts a new episode of the same task in each finished slot
  (continuous rollouts for PPO, full batches for throughput); ``trajectories()`` returns
  the finished episodes too.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from components.config import Config, SyntheticEnvConfig
from components.experience.dataset import PromptSettings, Retriever
from components.experience.format import Prediction, parse_answer

# the prompts and answers of the model, and the episode bookkeeping, live in their own
# modules; the names other code imports from here stay importable
from components.experience.synthetic_answers import (  # noqa: F401
    QUERY_POLICY,
    GenerateFn,
    Messages,
    generate_fns,
    generate_parsed,
    local_generate_fns,
    prompt_settings,
    query_transition,
    step_messages,
)
from components.experience.synthetic_episodes import (  # noqa: F401
    FEEDBACK_PREFIX,
    MALFORMED,
    REASONING,
    RESAMPLED,
    SYNTHETIC,
    EpisodeRecord,
    EpisodeSlots,
    RealStateIndex,
    StepOutput,
    _norm,
    episode_transition,
    feedback_of,
    stamp_trajectory,
    step_info,
    world_key,
)
from components.schema import Provenance, Task, Transition, seed_int

EMPTY_ACTION = "(empty)"  # stands in for a blank action (records need a non-empty one)


@dataclass
class _Episode(EpisodeRecord):
    """Mutable state of one slot (what the LLM env adds to the record)."""

    admissible: list[str] | None = None
    malformed: bool = False


class VectorSyntheticEnv(EpisodeSlots[_Episode]):
    """Many synthetic episodes advanced together: one generate and one retrieval per step."""

    def __init__(
        self,
        generate: GenerateFn,
        index: RealStateIndex,
        *,
        cfg: SyntheticEnvConfig,
        prompt: PromptSettings,
        retriever: Retriever | None = None,
        resample: GenerateFn | None = None,
        env_name: str = "textworld",
        namespace: str = "synthetic",
    ) -> None:
        if prompt.k > 0 and retriever is None:
            raise ValueError("k > 0 needs a retriever (or use k = 0, the no-replay ablation)")
        super().__init__(env_name, namespace)
        self.generate = generate
        self.resample = resample or generate  # a sampling `generate` can resample itself
        self.index = index
        self.cfg = cfg
        self.prompt = prompt
        self.retriever = retriever
        self.generated_states: dict[str, str] = {}  # task_id -> model-written initial state
        self._seconds: Counter[str] = Counter()
        self._calls = 0  # sampling calls since the last reset (``sample_seed``)

    @classmethod
    def from_config(
        cls,
        cfg: Config,
        backend: Any,
        index: RealStateIndex,
        *,
        buffer: Any = None,
        retriever: Retriever | None = None,
        meta: Mapping[str, Any] | None = None,
        namespace: str = "synthetic",
    ) -> VectorSyntheticEnv:
        """The env of a run: ``cfg.synthetic`` decoding, prompt settings, buffer retrieval.

        ``meta`` (``sft.load_meta(model_dir)``) fixes the prompt to the one the model was
        trained with; without it the prompt follows ``cfg.synthetic`` and the ablations.
        Neighbours come from ``retriever`` if given, else from ``buffer``.
        """
        from components.experience.dataset import buffer_retriever

        prompt = prompt_settings(cfg, meta)
        if prompt.k > 0 and retriever is None:
            if buffer is None:
                raise ValueError(f"k = {prompt.k} needs the replay buffer (or ablation.no_replay)")
            retriever = buffer_retriever(buffer, env=cfg.env.name)
        made: list[VectorSyntheticEnv] = []  # the env seeds its own sampling calls
        generate, resample = generate_fns(
            backend, cfg.synthetic, seed_of=lambda name: made[0].sample_seed(name)
        )
        env = cls(
            generate,
            index,
            cfg=cfg.synthetic,
            prompt=prompt,
            retriever=retriever if prompt.k > 0 else None,
            resample=resample,
            env_name=cfg.env.name,
            namespace=namespace,
        )
        made.append(env)
        return env

    def sample_seed(self, name: str) -> int:
        """The seed of a sampling call: this env's run (namespace), episodes started and
        calls since the last reset; a resumed run (``load_state_dict``) draws the same."""
        self._calls += 1
        return seed_int(self.cfg.seed, self.namespace, self._started, self._calls, name)

    # ------------------------------------------------------------------ state

    @property
    def episode_steps(self) -> list[int]:
        """Per slot: steps taken so far in its current episode."""
        return [len(e.steps) for e in self._slots]

    @property
    def tasks(self) -> list[Task]:
        """The task of each slot."""
        return [e.task for e in self._slots]

    # ------------------------------------------------------------------ reset

    def reset(
        self, tasks: Sequence[Task], seed: int | None = None
    ) -> list[tuple[str, dict[str, Any]]]:
        """Start one episode per task (repeat a task for a group); returns (obs, info) each."""
        self._new_batch(tasks, seed)
        self._calls = 0
        states = self._initial_states(tasks)
        self._slots = []
        out = [self._start(task, state) for task, state in zip(tasks, states, strict=True)]
        return out

    def restart_finished(self) -> dict[int, tuple[str, dict[str, Any]]]:
        """Start a new episode of the same task in every finished slot (keeps the batch full).

        The finished episodes stay available to ``trajectories()``. For PPO-style continuous
        rollouts and throughput measurements; GRPO groups simply run a batch to the end.
        """
        slots = [i for i, e in enumerate(self._slots) if e.finished]
        if not slots:
            return {}
        tasks = [self._slots[i].task for i in slots]
        states = self._initial_states(tasks)
        out = {}
        for i, task, state in zip(slots, tasks, states, strict=True):
            self._archive.append(self._slots[i])
            out[i] = self._start(task, state, slot=i)
        return out

    def _start(
        self, task: Task, state: str | None, slot: int | None = None
    ) -> tuple[str, dict[str, Any]]:
        key = self._episode_key(task)
        ep = _Episode(key=key, task=task, initial_state=state or "", state=state or "")
        if slot is None:
            self._slots.append(ep)
        else:
            self._slots[slot] = ep
        if state is None:  # generated task whose initial state could not be written
            ep.finished = ep.malformed = True
            self._counts["n_failed_init"] += 1
            return "", self._info(ep, None, valid=True, malformed=True)
        ep.admissible = self.index.admissible(task.task_id, state)
        return state, self._info(ep, None, valid=True)

    def _initial_states(self, tasks: Sequence[Task]) -> list[str | None]:
        from components.experience.task_generation import initial_state_prompt, parse_state

        states: list[str | None] = []
        missing: dict[str, Task] = {}
        for task in tasks:
            state = self.index.initial_state(task.task_id) or self.generated_states.get(
                task.task_id
            )
            if state is None and not task.generated:
                raise KeyError(
                    f"no real initial state for task {task.task_id!r}: index the ingested "
                    "trajectories of its split or pass the state in initial_states"
                )
            if state is None:
                missing.setdefault(task.task_id, task)
            states.append(state)
        if missing:
            pending = list(missing.values())
            prompts = [initial_state_prompt(t, self._parent_state(t), t.family) for t in pending]
            written = self._generate_parsed(prompts, lambda _, t: parse_state(t), "init")
            for task, (state, _) in zip(pending, written, strict=True):
                if state is None:
                    state = self._parent_state(task)
                    self._counts["n_init_fallback"] += state is not None
                if state is not None:
                    self.generated_states[task.task_id] = state
            states = [
                s if s is not None else self.generated_states.get(t.task_id)
                for t, s in zip(tasks, states, strict=True)
            ]
        return states

    def _parent_state(self, task: Task) -> str | None:
        if task.parent_task_id is None:
            return None
        return self.index.initial_state(task.parent_task_id) or self.generated_states.get(
            task.parent_task_id
        )

    # ------------------------------------------------------------------ step

    def step(self, actions: Sequence[str | None]) -> list[StepOutput | None]:
        """Advance every live episode by its action; finished slots return None."""
        if len(actions) != len(self._slots):
            raise ValueError(f"{len(actions)} actions for {len(self._slots)} episodes")
        live = [i for i, e in enumerate(self._slots) if not e.finished]
        results: list[StepOutput | None] = [None] * len(self._slots)
        if not live:
            return results
        start = time.perf_counter()
        acts = {i: _norm(actions[i] or "") or EMPTY_ACTION for i in live}
        queries = [query_transition(self._slots[i], acts[i], self.name) for i in live]
        t0 = time.perf_counter()
        retrieved = (
            self.retriever(queries, self.prompt.k)
            if self.prompt.k > 0 and self.retriever is not None
            else [[] for _ in live]
        )
        self._seconds["retrieve"] += time.perf_counter() - t0
        prompts = [
            step_messages(self._slots[i], acts[i], hits[: self.prompt.k], self.prompt)
            for i, hits in zip(live, retrieved, strict=True)
        ]

        states = [self._slots[i].state for i in live]

        def parse(j: int, text: str) -> Prediction:
            return parse_answer(
                text,
                with_reasoning=self.prompt.with_reasoning,
                state=states[j],
                state_target=self.prompt.state_target,
            )

        predictions = self._generate_parsed(prompts, parse, "step")
        for i, (pred, resampled) in zip(live, predictions, strict=True):
            results[i] = self._advance(self._slots[i], acts[i], pred, resampled)
        self._counts["steps"] += len(live)
        self._counts["step_calls"] += 1
        self._seconds["step"] += time.perf_counter() - start
        return results

    def _generate_parsed(
        self, prompts: list[Messages], parse: Callable[[int, str], Any], what: str
    ) -> list[tuple[Any, bool]]:
        """(parsed or None, resampled) per prompt (``generate_parsed`` with this env's counts)."""
        return generate_parsed(
            self.generate, self.resample, prompts, parse, what, self._counts, self._seconds
        )

    def _advance(
        self, ep: _Episode, action: str, pred: Prediction | None, resampled: bool
    ) -> StepOutput:
        # commands are case-insensitive in the real envs (TextWorld lower-cases them)
        valid = ep.admissible is None or action.lower() in {a.lower() for a in ep.admissible}
        if pred is None:  # malformed twice: the episode fails, nothing is recorded
            ep.finished = ep.malformed = True
            self._counts["n_failed_malformed"] += 1
            info = self._info(ep, None, valid=valid, malformed=True, resampled=resampled)
            return StepOutput(ep.state, 0, True, False, info)
        self._counts["n_repaired"] += resampled
        terminated = pred.reward == 1
        truncated = not terminated and len(ep.steps) + 1 >= self.cfg.max_steps
        ep.steps.append(
            episode_transition(
                ep,
                Transition.make_id(ep.key, len(ep.steps)),
                env=self.name,
                action=action,
                next_state=pred.next_state,
                reward=pred.reward,
                done=terminated or truncated,
                admissible_actions=ep.admissible,
                valid_action=valid,
                provenance=Provenance(policy=QUERY_POLICY),
            )
        )
        ep.reasoning.append(pred.reasoning)
        ep.state = pred.next_state
        ep.admissible = self.index.admissible(ep.task.task_id, ep.state)
        if terminated or truncated:
            ep.finished = True
            ep.success = terminated
            ep.truncated = truncated
            self._counts["successes"] += terminated
        info = self._info(ep, pred.reasoning, valid=valid, resampled=resampled)
        return StepOutput(pred.next_state, pred.reward, terminated, truncated, info)

    def _info(
        self,
        ep: _Episode,
        reasoning: str | None,
        *,
        valid: bool,
        malformed: bool = False,
        resampled: bool = False,
    ) -> dict[str, Any]:
        return step_info(
            None if ep.finished else ep.admissible,
            valid=valid,
            won=ep.success,
            lost=False,  # the experience model predicts success only, never a dead end
            feedback=feedback_of(ep.state),
            reasoning=reasoning,
            malformed=malformed,
            **{RESAMPLED: resampled},
        )

    # ------------------------------------------------------------------ outputs

    def metrics(self, reset: bool = False) -> dict[str, float]:
        """Counts (steps, malformed, resampled, failed) and seconds per phase since creation."""
        out = {k: float(v) for k, v in self._counts.items()}
        for key in ("n_malformed", "n_resampled", "n_failed_malformed", "n_repaired", "steps"):
            out.setdefault(key, 0.0)
        out.update({f"seconds_{k}": round(v, 4) for k, v in self._seconds.items()})
        steps, seconds = out["steps"], self._seconds.get("step", 0.0)
        out["steps_per_s"] = round(steps / seconds, 3) if seconds > 0 else 0.0
        answers = steps + out["n_resampled"]  # every answer parsed, resamples included
        out["malformed_rate"] = round(out["n_malformed"] / answers, 4) if answers else 0.0
        if reset:
            self._counts.clear()
            self._seconds.clear()
        return out


class SyntheticEnv:
    """One synthetic episode at a time behind the ``Env`` protocol (a one-slot vector env)."""

    def __init__(self, generate: GenerateFn, index: RealStateIndex, **kwargs: Any) -> None:
        self.vec = VectorSyntheticEnv(generate, index, **kwargs)
        self.name = self.vec.name

    def reset(self, task: Task, seed: int | None = None) -> tuple[str, dict[str, Any]]:
        """Start an episode of ``task`` from its initial state."""
        return self.vec.reset([task], seed=seed)[0]

    def step(self, action: str) -> tuple[str, int, bool, bool, dict[str, Any]]:
        """Ask the experience model for the next state and reward of ``action``."""
        if not self.vec.num_envs or self.vec.done:
            raise RuntimeError("the episode is over (or never started): call reset first")
        out = self.vec.step([action])[0]
        assert out is not None
        return tuple(out)  # type: ignore[return-value]

    def trajectory(self, *, policy: str, iteration: int = 0, checkpoint: str | None = None):
        """The current episode as a synthetic Trajectory (None before the first step)."""
        trajs = self.vec.trajectories(policy=policy, iteration=iteration, checkpoint=checkpoint)
        return trajs[0] if trajs else None

    def metrics(self) -> dict[str, float]:
        """See ``VectorSyntheticEnv.metrics``."""
        return self.vec.metrics()

    def close(self) -> None:
        """Nothing to release (the model belongs to the caller)."""
