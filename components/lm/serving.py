"""The experience model's (and the LM policy's) generation backend, chosen by ``serving``.

``serving.backend = "local"`` loads ``serving.experience_model`` (a model directory, relative
to the project root) with transformers and decodes with the fast batched ``Generator``;
``"openai"`` sends the prompts to an OpenAI-compatible server (a vLLM server started with
``--served-model-name <serving.experience_model>``) whose URL is in the environment
variable named by ``serving.base_url_env``. Both answer ``generate(prompts, **decoding)``,
so the synthetic env cannot tell them apart.

``serving.policy_backend = "openai"`` sends the LM policy's evaluation prompts to the same
kind of server (``policy_backend``); the policy keeps its local weights to tokenise and to
score (components/agent/policy_model.py).

A failed experience-model request becomes an empty answer (``on_failure="empty"``): the synthetic
env's strict parser counts it as malformed and resamples once, so a flaky server never
crashes a run.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from components.config import SERVING_BACKENDS, ServingConfig
from components.config.base import fields_of

if TYPE_CHECKING:
    from components.lm.generate import CompletionBackend
    from components.lm.openai_backend import OpenAIBackendConfig

LOCAL, OPENAI = SERVING_BACKENDS


def local_model_dir(serving: ServingConfig, root: Path) -> Path:
    """The local experience model's directory (``experience_model`` resolved against root)."""
    path = Path(serving.experience_model)
    return path if path.is_absolute() else Path(root) / path


def openai_backend_config(serving: ServingConfig) -> OpenAIBackendConfig:
    """The server client's settings for the served experience model."""
    from components.lm.openai_backend import OpenAIBackendConfig

    client = ("base_url_env", "api_key_env", "concurrency", "max_retries", "timeout_s")
    return OpenAIBackendConfig(
        model=serving.experience_model, **fields_of(serving, *client), on_failure="empty"
    )


def experience_backend(serving: ServingConfig, root: Path) -> CompletionBackend:
    """The backend that serves the experience model, as ``serving`` says."""
    if serving.backend == OPENAI:
        from components.lm.openai_backend import OpenAIBackend

        return OpenAIBackend(openai_backend_config(serving))
    from components.lm.generate import Generator
    from components.lm.models import load_pretrained_dir

    model, tokenizer = load_pretrained_dir(local_model_dir(serving, root))
    return Generator(model, tokenizer)


def policy_model_name(serving: ServingConfig, policy_dir: Path, root: Path) -> str:
    """The served name of a saved policy: ``policy_model``, else its directory relative to
    the project root (the name ``vllm serve <dir>`` and ``dreamgym serve --model <dir>`` give)."""
    if serving.policy_model:
        return serving.policy_model
    path, root = Path(policy_dir).resolve(), Path(root).resolve()
    return path.relative_to(root).as_posix() if path.is_relative_to(root) else str(path)


def policy_backend(serving: ServingConfig, model_name: str) -> CompletionBackend:
    """The server client that decodes a policy served as ``model_name``.

    Prompts are sent as the text the policy's chat template rendered, tokenised without
    special tokens (exactly the local prompt ids), and the server is asked for the generated
    token ids: on the same weights and numerics a greedy answer is the local one, token
    for token.
    """
    from components.lm.openai_backend import OpenAIBackend, OpenAIBackendConfig

    client = ("base_url_env", "api_key_env", "concurrency", "max_retries", "timeout_s")
    cfg = OpenAIBackendConfig(
        model=model_name,
        **fields_of(serving, *client),
        add_special_tokens=False,
        return_token_ids=True,
    )
    return OpenAIBackend(cfg)
