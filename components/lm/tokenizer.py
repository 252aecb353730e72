"""A byte-level BPE tokenizer trained on the project's own text, with a ChatML template.

Used by the from-scratch models (tests, ci, and the cpu profile when it wins): a tokenizer
trained on the collected data compresses TextWorld states far better than a general one,
so sequences are shorter and training is cheaper. The chat template is ChatML-like and its
end-of-turn token ``<|im_end|>`` is the eos token, so generation stops at the end of the
assistant turn and TRL trains the model to emit it (shared/STACK.md).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|pad|>"
BOS_TOKEN = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"  # end of turn = eos
SPECIAL_TOKENS = (PAD_TOKEN, BOS_TOKEN, EOS_TOKEN)
# The answer tags of the experience model and the agent: one token each, so a small model
# learns the format early; kept as normal (non-special) tokens so decoding keeps them.
TAG_TOKENS = (
    "<think>",
    "</think>",
    "<state>",
    "</state>",
    "<reward>",
    "</reward>",
    "<action>",
    "</action>",
)
# ChatML, with {% generation %} markers so TRL's assistant_only_loss also works on
# conversational "messages" datasets (the agent's SFT baseline).
CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' %}"
    "{{ '<|im_start|>assistant\n' }}"
    "{% generation %}{{ message['content'] + '<|im_end|>' }}{% endgeneration %}"
    "{{ '\n' }}"
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def train_tokenizer(
    texts: Iterable[str], vocab_size: int, min_frequency: int = 2
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on ``texts``; eos = the chat template's end of turn."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # any byte stays encodable
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        chat_template=CHAT_TEMPLATE,
        clean_up_tokenization_spaces=False,
    )
    fast.add_tokens(list(TAG_TOKENS))
    return fast


def save_tokenizer(tokenizer: PreTrainedTokenizerFast, out_dir: Path) -> None:
    """Save the tokenizer (tokenizer.json + config with the chat template)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(str(out_dir))
