"""The LLM experience model's side of the synthetic env: backends, prompts, answers.

``generate_fns`` turns a generation backend into the env's (generate, resample) functions,
``prompt_settings`` gives the prompt the model was trained with; ``step_messages`` is a
step's chat prompt and ``query_transition`` its retrieval query; ``generate_parsed`` asks
for a batch of answers and parses them strictly, malformed ones resampled once in one
batched call.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from components.config import Config, SyntheticEnvConfig
from components.experience.dataset import PromptSettings, settings_for
from components.experience.format import (
    SYSTEM_PROMPT,
    MalformedOutputError,
    StepContext,
    render_prompt,
)
from components.experience.synthetic_episodes import EpisodeRecord, episode_transition
from components.schema import Provenance, Transition, stable_id

Messages = list[dict[str, str]]
GenerateFn = Callable[[list[Messages]], list[str]]

QUERY_POLICY = "query"  # provenance of the throwaway retrieval queries


def generate_fns(
    backend: Any,
    cfg: SyntheticEnvConfig,
    stop: Sequence[str] = ("</reward>",),
    seed_of: Callable[[str], int] | None = None,
) -> tuple[GenerateFn, GenerateFn]:
    """(generate, resample) over a generation backend with the env's decoding settings.

    ``backend`` is anything with the ``generate(prompts, *, max_new_tokens, temperature,
    top_p, stop, batch_size, seed)`` method: ``components.lm.generate.Generator`` (local
    transformers) or ``components.lm.openai_backend.OpenAIBackend`` (a vLLM server; build
    it with ``on_failure="empty"`` so a failed request is a malformed answer, resampled
    once, instead of an exception). ``resample`` samples at ``resample_temperature``.
    ``seed_of(name)`` gives each sampling call its seed (the env's: its run and its
    place in it); without it, ``cfg.seed`` plus the calls so far.
    """
    calls = Counter[str]()

    def make(temperature: float, name: str) -> GenerateFn:
        def fn(prompts: list[Messages]) -> list[str]:
            calls[name] += 1  # a new seed per call: sampled resamples differ across steps
            seed = seed_of(name) if seed_of is not None else cfg.seed + calls[name]
            return backend.generate(
                prompts,
                max_new_tokens=cfg.max_new_tokens,
                temperature=temperature,
                top_p=cfg.top_p,
                stop=stop,
                batch_size=cfg.gen_batch_size,
                seed=seed if temperature > 0 else None,
            )

        return fn

    return make(cfg.temperature, "generate"), make(cfg.resample_temperature, "resample")


# the first name of ``generate_fns`` (components/stages/evaluation.py imports it)
local_generate_fns = generate_fns


def prompt_settings(cfg: Config, meta: Mapping[str, Any] | None = None) -> PromptSettings:
    """The model's own prompt settings (from its meta) if known, else config + ablations."""
    if meta is not None and "prompt" in meta:
        return PromptSettings(**meta["prompt"])
    ab = cfg.ablation
    return settings_for(
        cfg.synthetic.history_len,
        cfg.synthetic.k,
        no_history=ab.no_history,
        no_replay=ab.no_replay,
        no_reasoning=ab.no_reasoning,
        state_target=cfg.experience.state_target,
    )


def query_transition(ep: EpisodeRecord, action: str, env: str) -> Transition:
    """The retrieval query of ``ep``'s next step."""
    # a throwaway record: retrieval embeds (task, state, action) and skips its episode
    return episode_transition(
        ep,
        stable_id(ep.key, len(ep.steps), "query"),
        env=env,
        action=action,
        next_state="",
        reward=0,
        done=False,
        valid_action=True,
        provenance=Provenance(policy=QUERY_POLICY),
    )


def step_messages(
    ep: EpisodeRecord, action: str, retrieved: Sequence[Transition], prompt: PromptSettings
) -> Messages:
    """The chat prompt of ``ep``'s next step: its last steps, state, action, retrieved ones."""
    n = prompt.history_len
    history = tuple((s.action, s.next_state) for s in ep.steps[-n:]) if n > 0 else ()
    ctx = StepContext(
        instruction=ep.task.instruction,
        state=ep.state,
        action=action,
        history=history,
        retrieved=tuple(retrieved),
    )
    return [
        {"role": "system", "content": SYSTEM_PROMPT},
        {"role": "user", "content": render_prompt(ctx, prompt.state_target)},
    ]


def generate_parsed(
    generate: GenerateFn,
    resample: GenerateFn,
    prompts: list[Messages],
    parse: Callable[[int, str], Any],
    what: str,
    counts: Counter[str],
    seconds: Counter[str],
) -> list[tuple[Any, bool]]:
    """(parsed or None, resampled) per prompt: one batched resample of malformed answers.

    ``parse(j, text)`` parses the answer to prompt ``j`` (a delta needs its state);
    malformed answers, resamples and seconds are counted in ``counts`` and ``seconds``.
    """
    suffix = "" if what == "step" else f"_{what}"  # step counters keep the short names
    t0 = time.perf_counter()
    texts = generate(prompts)
    seconds[f"generate_{what}"] += time.perf_counter() - t0
    if len(texts) != len(prompts):
        raise ValueError(f"generate returned {len(texts)} answers for {len(prompts)} prompts")
    parsed = [_try(parse, j, t, counts, suffix) for j, t in enumerate(texts)]
    bad = [j for j, p in enumerate(parsed) if p is None]
    if bad:
        counts[f"n_resampled{suffix}"] += len(bad)
        t0 = time.perf_counter()
        again = resample([prompts[j] for j in bad])
        seconds[f"resample_{what}"] += time.perf_counter() - t0
        for j, text in zip(bad, again, strict=True):
            parsed[j] = _try(parse, j, text, counts, suffix)
    resampled = set(bad)
    return [(p, j in resampled) for j, p in enumerate(parsed)]


def _try(
    parse: Callable[[int, str], Any], j: int, text: str, counts: Counter[str], suffix: str
) -> Any:
    try:
        return parse(j, text)
    except MalformedOutputError:
        counts[f"n_malformed{suffix}"] += 1
        return None
