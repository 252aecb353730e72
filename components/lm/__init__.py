"""Shared language-model utilities: tokenizer training, model building/loading, generation.

Used by the experience model and the agent. Heavy libraries (torch, transformers,
tokenizers, peft) are imported inside the functions, so importing this package is cheap.
"""
