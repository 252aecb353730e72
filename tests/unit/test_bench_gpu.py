"""The GPU benchmarks' CPU-side parts: backend wiring, kernel categories, no-CUDA exits."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")


@pytest.fixture(scope="module")
def tiny_llama():
    from tests.lm.tiny import tiny_llama

    return tiny_llama(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1)


def test_every_graph_backend_builds_its_decoder(tiny_llama):
    from bench.fused_decode import FusedGraphDecoder
    from bench.gpu_decode import GRAPH_BACKENDS, make_decoder
    from components.lm.graph_decode import GraphDecoder

    for label, options in GRAPH_BACKENDS.items():
        if options.get("compile") or options.get("micro_batches"):
            continue  # torch.compile and CUDA streams are the GPU run's business
        dec = make_decoder(tiny_llama, 2, 16, graphs=False, **options)
        assert isinstance(dec, FusedGraphDecoder) == label.startswith("graph_fused"), label
        assert isinstance(dec, GraphDecoder)
        assert getattr(dec, "pdl", False) == options.get("pdl", False)
        assert getattr(dec, "f32_residual", False) == options.get("f32_residual", False)
    assert GRAPH_BACKENDS["graph_fused"] == {"decoder": "fused"}  # the option was not consumed


def test_the_fused_decoder_gathers_the_models_rotary_terms(tiny_llama):
    from bench.fused_decode import FusedGraphDecoder

    dec = FusedGraphDecoder(tiny_llama, 2, 16, graphs=False)
    positions = torch.tensor([[0, 5, 15]])
    cos, sin = tiny_llama.model.rotary_emb(torch.zeros(1, 1, 32), positions)
    torch.testing.assert_close(dec.rotary[[0, 5, 15], 0], cos[0])
    torch.testing.assert_close(dec.rotary[[0, 5, 15], 1], sin[0] * dec.rotate_sign)


def test_kernels_are_sorted_into_categories():
    from bench.decode_profile import category

    assert category("decode_attention_kernel") == "attention"
    assert category("fused_linear_kernel") == "fused_gemm"
    assert category("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n") == "cublas_gemm"
    assert category("nvjet_tst_64x8_64x16_4x1_v_bz_TNT") == "cublas_gemm"
    assert category("triton_red_fused__to_copy_add_mean_mul_pow_rsqrt_0") == "compiled_elementwise"
    assert category("void at::native::vectorized_elementwise_kernel<4>") == "torch_elementwise"
    assert category("memcpy") == "other"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA exit")
@pytest.mark.parametrize("module", ["bench.gpu_decode", "bench.decode_profile"])
def test_without_cuda_the_gpu_benchmarks_leave_their_results_alone(module, tmp_path, monkeypatch):
    import importlib

    bench = importlib.import_module(module)
    target = tmp_path / "results.json"
    monkeypatch.setattr(bench, "RESULTS", target)
    assert bench.main() is None
    assert not target.exists()


def test_few_row_calls_time_only_tiles_that_fit_their_rows():
    from types import SimpleNamespace

    from bench.fused_decode import _fit_rows

    tiles = [SimpleNamespace(kwargs={"BLOCK_M": m}) for m in (16, 32, 64)]
    assert [t.kwargs["BLOCK_M"] for t in _fit_rows(tiles, {"M": 8})] == [16]
    assert [t.kwargs["BLOCK_M"] for t in _fit_rows(tiles, {"M": 17})] == [16, 32]
    assert len(_fit_rows(tiles, {"M": 256})) == 3
    assert _fit_rows(tiles[2:], {"M": 4}) == tiles[2:]  # never none
