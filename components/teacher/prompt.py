"""The teacher prompt shared by the LLM backends (openai, hf)."""

from __future__ import annotations

from components.teacher.base import AnnotationRequest

MAX_ADMISSIBLE_SHOWN = 40

SYSTEM_PROMPT = (
    "You annotate recorded steps of a text environment for training a world model. "
    "Given the task, the recent history, the current state s_t, the agent's action a_t, "
    "the TRUE next state s_t+1 and the TRUE reward r (1 only when the task is completed, "
    "otherwise 0), explain step by step why taking a_t in s_t leads to exactly s_t+1 and "
    "r. Say whether the action is valid here; an invalid action leaves the state "
    "unchanged with reward 0. Name what changes (location, inventory, object states) and "
    "why the reward is 0 or 1 with respect to the task. Use only facts visible in the "
    "input. Answer with the reasoning only, wrapped in a single <think>...</think> block, "
    "and nothing outside it."
)


def render_user_prompt(req: AnnotationRequest) -> str:
    """The user message describing one transition and its history."""
    t = req.transition
    parts = [f"Task: {t.instruction}"]
    if req.history:
        lines = [
            f"- step {h.step_index}: action '{h.action}' -> reward {h.reward}"
            + ("" if h.valid_action else " (invalid action)")
            for h in req.history
        ]
        parts.append("Recent history:\n" + "\n".join(lines))
    parts.append(f"Current state (s_t):\n{t.state}")
    if t.admissible_actions is not None:
        shown = t.admissible_actions[:MAX_ADMISSIBLE_SHOWN]
        more = len(t.admissible_actions) - len(shown)
        listing = ", ".join(shown) + (f", ... ({more} more)" if more > 0 else "")
        parts.append(f"Admissible actions: {listing}")
    parts.append(f"Action (a_t): {t.action}")
    parts.append(f"Action valid: {'yes' if t.valid_action else 'no'}")
    parts.append(f"Next state (s_t+1):\n{t.next_state}")
    parts.append(f"Reward: {t.reward}   Episode done: {'yes' if t.done else 'no'}")
    parts.append("Explain why, inside <think>...</think> only.")
    return "\n\n".join(parts)


def build_messages(req: AnnotationRequest) -> list[dict[str, str]]:
    """Chat messages (system + user) for one request."""
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": render_user_prompt(req)},
    ]
