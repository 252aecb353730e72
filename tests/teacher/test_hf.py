"""HF backend with tiny local models (no downloads): validation and accounting, not quality."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from components.config import TeacherConfig
from components.teacher import annotate, failures_path_for, iter_requests, make_teacher
from components.teacher.hf_teacher import HFTeacher
from tests.teacher.conftest import make_config, make_trajectories

pytestmark = [pytest.mark.integration, pytest.mark.timeout(120)]

SPECIALS = ["<pad>", "<unk>", "<bos>", "<eos>", "<|system|>", "<|user|>", "<|assistant|>"]
WORDS = ["<think>", "</think>", "because", "the", "action", "is", "valid"]
TEMPLATE = (
    "{% for m in messages %}<|{{ m['role'] }}|> {{ m['content'] }} {% endfor %}"
    "{% if add_generation_prompt %}<|assistant|> {% endif %}"
)


def build_tiny(path: Path, rigged: bool) -> Path:
    """Save a 1-layer Llama + word-level tokenizer with a chat template under ``path``.

    ``rigged``: weights set so greedy decoding after '<|assistant|>' always says
    '<think> because </think>' then EOS (every layer zeroed: the last token's one-hot
    embedding reaches the head, which maps it to the next token of that answer).
    """
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    vocab = {t: i for i, t in enumerate(SPECIALS + WORDS)}
    core = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    core.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    core.decoder = decoders.WordPiece(prefix="##")  # joins words with spaces
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token="<pad>",
        unk_token="<unk>",
        bos_token="<bos>",
        eos_token="<eos>",
    )
    tok.chat_template = TEMPLATE
    hidden = 16
    cfg = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=4096,
        pad_token_id=vocab["<pad>"],
        bos_token_id=vocab["<bos>"],
        eos_token_id=vocab["<eos>"],
        tie_word_embeddings=False,
    )
    model = LlamaForCausalLM(cfg)
    if rigged:
        chain = ["<|assistant|>", "<think>", "because", "</think>", "<eos>"]
        with torch.no_grad():
            for name, p in model.named_parameters():
                if "layers." in name and "norm" not in name:
                    p.zero_()
            model.model.embed_tokens.weight.copy_(torch.eye(len(vocab), hidden))
            head = torch.zeros(len(vocab), hidden)
            for a, b in itertools.pairwise(chain):
                head[vocab[b], vocab[a]] = 1.0
            model.lm_head.weight.copy_(head)
    tok.save_pretrained(path)
    model.save_pretrained(path)
    return path


def hf_config(model_dir: Path, **kw: object) -> TeacherConfig:
    settings: dict = {"backend": "hf", "model": str(model_dir), "max_tokens": 6}
    settings.update(kw)
    return TeacherConfig(**settings)


def test_random_tiny_model_output_is_counted_as_malformed(tmp_path) -> None:
    model_dir = build_tiny(tmp_path / "tiny", rigged=False)
    cfg = make_config(**hf_config(model_dir, max_retries=1, batch_size=2).model_dump())
    teacher = make_teacher(cfg.teacher)
    assert isinstance(teacher, HFTeacher)
    out = tmp_path / "a.jsonl"
    stats = annotate(cfg, make_trajectories(1, 3), out, teacher=teacher, progress=False)

    assert stats["n_failed"] == 3 and stats["n_annotated"] == 0
    assert stats["prompt_tokens"] > 0 and stats["completion_tokens"] > 0
    assert out.read_text() == ""
    fails = [json.loads(x) for x in failures_path_for(out).read_text().splitlines()]
    assert len(fails) == 3
    assert all(f["error"].startswith("malformed") and f["attempts"] == 2 for f in fails)


def test_rigged_tiny_model_passes_validation(tmp_path) -> None:
    model_dir = build_tiny(tmp_path / "rigged", rigged=True)
    teacher = HFTeacher(hf_config(model_dir, batch_size=4))
    reqs = list(iter_requests(make_trajectories(1, 3), history_len=2))
    seen = []
    anns = teacher.annotate(reqs, on_result=seen.append)
    assert [a.id for a in anns] == [r.id for r in reqs] and len(seen) == 3
    for a in anns:
        assert a.ok, (a.error, a.raw)
        assert a.reasoning == "because" and a.attempts == 1
        assert a.completion_tokens == 4  # <think> because </think> <eos>
    rendered = teacher.render(reqs[0])
    assert rendered.startswith("<|system|>") and rendered.endswith("<|assistant|> ")
