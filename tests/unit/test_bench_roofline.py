"""The roofline arithmetic behind issue 24's GPU target: peak lookup, bytes per step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    ("name", "peak"),
    [
        ("NVIDIA H100 80GB HBM3", 3.35e12),
        ("NVIDIA H100 PCIe", 2.0e12),
        ("NVIDIA H100 NVL", 3.9e12),
        ("NVIDIA H200", 4.8e12),
        ("NVIDIA GH200 480GB", 4.0e12),
        ("NVIDIA A100-SXM4-80GB", 2.039e12),
        ("NVIDIA A100-SXM4-40GB", 1.555e12),
        ("NVIDIA L40S", 0.864e12),
        ("NVIDIA L40", 0.864e12),
        ("NVIDIA L4", 0.3e12),
        ("NVIDIA GeForce RTX 4090", 1.008e12),
        ("Tesla T4", None),
    ],
)
def test_peak_bandwidth_matches_torchs_device_names(name, peak):
    from bench.roofline import peak_bandwidth

    assert peak_bandwidth(name) == peak


def _llama(tied: bool):
    from tests.lm.tiny import tiny_llama

    # GQA: 4 query heads share 2 key/value heads of width 16
    return tiny_llama(
        vocab_size=100, hidden_size=64, num_hidden_layers=2, tie_word_embeddings=tied
    ).to(torch.bfloat16)


def test_a_decode_step_reads_the_weights_once_and_every_rows_kv_cache():
    from bench.roofline import decode_bytes_per_step, kv_bytes_per_token

    model = _llama(tied=True)
    # keys + values x 2 layers x 2 kv heads x 16 dims x 2 bytes
    assert kv_bytes_per_token(model) == 2 * 2 * 2 * 16 * 2
    weights = sum(p.numel() for p in model.parameters()) * 2  # the tied matrix counted once
    assert decode_bytes_per_step(model, batch=1, context=0) == weights
    assert decode_bytes_per_step(model, batch=8, context=100.5) == weights + 8 * 100.5 * 256


def test_an_untied_input_embedding_is_looked_up_not_read():
    from bench.roofline import weight_bytes_per_step

    tied, untied = _llama(tied=True), _llama(tied=False)
    embed = untied.get_input_embeddings().weight
    assert embed is not untied.get_output_embeddings().weight
    # the untied model holds one more vocab x hidden matrix, which a step does not read
    assert (
        sum(p.numel() for p in untied.parameters())
        == sum(p.numel() for p in tied.parameters()) + embed.numel()
    )
    assert weight_bytes_per_step(untied) == weight_bytes_per_step(tied)


def test_the_fraction_is_achieved_over_peak_bandwidth():
    from bench.roofline import roofline_fraction

    # 3.35 GB in 2 ms on a 3.35 TB/s H100 is half the roofline
    assert roofline_fraction(3.35e9, 2e-3, 3.35e12) == pytest.approx(0.5)
