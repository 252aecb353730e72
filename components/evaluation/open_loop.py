"""Open-loop multi-step fidelity: the experience model fed its own predictions.

Single-step fidelity conditions every prediction on the real state. In the synthetic env
the model conditions on its own earlier predictions, so errors compound. Here, for
recorded validation episodes, the model replays the recorded action sequence from the
real initial state with its predicted states (and predicted history) as context, and
each predicted state is compared with the real one at the same depth. TextWorld games are
deterministic, so the recorded states are exactly what the real simulator returns for
that action sequence (the env's replay test asserts it). A malformed answer ends that
episode's rollout and is counted.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from components.evaluation.fidelity import GenerateFn, normalize_state, token_f1
from components.experience.dataset import PromptSettings, Retriever
from components.experience.format import (
    SYSTEM_PROMPT,
    MalformedOutputError,
    StepContext,
    parse_answer,
    render_prompt,
)
from components.schema import Trajectory


def open_loop_rollouts(
    generate: GenerateFn,
    episodes: Sequence[Trajectory],
    settings: PromptSettings,
    retriever: Retriever | None,
    horizon: int,
) -> dict[str, Any]:
    """Per-depth state match and reward accuracy of open-loop rollouts (batched per depth)."""
    live = [(traj, traj.initial_state, []) for traj in episodes if traj.n_steps > 0]
    per_depth: list[dict[str, Any]] = []
    n_malformed = 0
    for depth in range(horizon):
        live = [(t, s, h) for t, s, h in live if depth < t.n_steps]
        if not live:
            break
        steps = [t.steps[depth] for t, _, _ in live]
        queries = [
            step.model_copy(update={"state": state})
            for step, (_, state, _) in zip(steps, live, strict=True)
        ]
        hits = (
            retriever(queries, settings.k)
            if retriever is not None and settings.k > 0
            else [[] for _ in live]
        )
        prompts = []
        for step, (traj, state, hist), near in zip(steps, live, hits, strict=True):
            ctx = StepContext(
                instruction=step.instruction,
                state=state,
                action=step.action,
                history=tuple(hist[-settings.history_len :]) if settings.history_len else (),
                retrieved=tuple(t for t in near if t.episode_id != traj.episode_id)[: settings.k],
            )
            prompts.append(
                [
                    {"role": "system", "content": SYSTEM_PROMPT},
                    {"role": "user", "content": render_prompt(ctx, settings.state_target)},
                ]
            )
        outputs = generate(prompts)
        f1s, ems, reward_ok = [], [], []
        survivors = []
        for step, (traj, state, hist), out in zip(steps, live, outputs, strict=True):
            try:
                pred = parse_answer(
                    out,
                    with_reasoning=settings.with_reasoning,
                    state=state,
                    state_target=settings.state_target,
                )
            except MalformedOutputError:
                n_malformed += 1
                f1s.append(0.0)
                ems.append(False)
                reward_ok.append(False)
                continue
            f1s.append(token_f1(pred.next_state, step.next_state))
            ems.append(normalize_state(pred.next_state) == normalize_state(step.next_state))
            reward_ok.append(pred.reward == step.reward)
            if not step.done:
                survivors.append((traj, pred.next_state, [*hist, (step.action, pred.next_state)]))
        n = len(f1s)
        per_depth.append(
            {
                "depth": depth + 1,
                "n": n,
                "state_soft_match": sum(f1s) / n,
                "state_exact_match": sum(ems) / n,
                "reward_accuracy": sum(reward_ok) / n,
            }
        )
        live = survivors
    return {
        "episodes": len(episodes),
        "horizon": horizon,
        "n_malformed": n_malformed,
        "per_depth": per_depth,
    }
