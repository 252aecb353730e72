"""The LM policy decoding on an OpenAI-compatible server (``serving.policy_backend: openai``).

The server holds the same weights as the local ``PolicyModel`` (``vllm serve <policy dir>``
or ``dreamgym serve --model <policy dir>``). The rendered prompts go out as text, tokenised
there without special tokens (the local prompt ids exactly), and the answer's token ids
come back (re-encoded from its text when a server does not send them), so with the same
numerics (``dreamgym serve``) a greedy served answer is token for token the local one.
Log-probabilities are scored locally, under the local weights. Only fixed weights are
served: RL rollouts always decode in process.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from components.agent.policy import ACTION_STOP

if TYPE_CHECKING:
    from components.agent.policy_model import PolicyModel


def served_ids(
    policy: PolicyModel,
    texts: Sequence[str],
    prompts: Sequence[Sequence[int]],
    temperature: float,
    max_new_tokens: int,
    *,
    with_logprobs: bool = False,
) -> tuple[list[list[int]], list[tuple[float, ...]]]:
    """``PolicyModel.generate_ids`` on ``policy.backend``: completion ids per prompt, cut
    after ``</action>`` or eos (both kept), and their log-probs (empty unless asked).

    Sampling sends a seed drawn from torch's global RNG (which evaluation seeds per pass),
    so a sampled pass is reproducible on a server too.
    """
    import torch

    assert policy.backend is not None
    seed = int(torch.randint(0, 2**31 - 1, ())) if temperature > 0 else None
    done = policy.backend.complete(
        list(texts),
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_p=1.0,
        stop=(ACTION_STOP,),
        seed=seed,
    )
    eos = policy.tokenizer.eos_token_id
    completions = []
    for c in done:
        ids = list(c.token_ids) or policy.tokenizer(c.text, add_special_tokens=False)["input_ids"]
        if not c.token_ids and c.finish_reason == "eos" and eos is not None:
            ids.append(eos)  # a local answer keeps its eos token too
        completions.append(ids)
    if not with_logprobs:
        return completions, [() for _ in completions]
    # greedy answers are scored at temperature 1, as the local decoder does
    return completions, policy.completion_logprobs(prompts, completions, temperature or 1.0)
