"""The experimental fused decode step (bench/fused_decode.py) equals plain torch.

Runs on CUDA, or on a CPU under Triton's interpreter (``TRITON_INTERPRET=1`` with triton
installed); the sm_90 compile check needs triton only. CI has no triton: it skips these.
"""

from __future__ import annotations

import os
import re

import pytest

torch = pytest.importorskip("torch")
_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
runs_kernels = pytest.mark.skipif(
    DEVICE == "cpu" and not _INTERPRET, reason="needs CUDA or TRITON_INTERPRET=1"
)


@pytest.fixture(scope="module")
def tiny_llama():
    """No repo fixtures here: on GPU machines this file runs with --noconftest."""
    from tests.lm.tiny import tiny_llama

    return tiny_llama()


def _randn(*shape):
    return torch.randn(*shape, device=DEVICE)


@runs_kernels
@pytest.mark.parametrize("bias", [False, True])
def test_norm_folded_into_the_gemm_equals_rms_norm_then_linear(bias):
    pytest.importorskip("triton")
    from bench.fused_decode import fused_linear

    torch.manual_seed(0)
    x, w, gain = _randn(5, 72), _randn(40, 72), _randn(72)
    b = _randn(40) if bias else None
    ref = torch.nn.functional.linear(torch.nn.functional.rms_norm(x, (72,), gain, 1e-5), w, b)
    out = fused_linear(x, (w * gain).contiguous(), bias=b, norm_eps=1e-5)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@runs_kernels
def test_gate_up_with_silu_and_the_residual_epilogue_equal_the_mlp():
    pytest.importorskip("triton")
    from bench.fused_decode import fused_linear

    torch.manual_seed(1)
    x, gain, gate_up, down = _randn(7, 48), _randn(48), _randn(80, 48), _randn(48, 40)
    hidden = torch.nn.functional.rms_norm(x, (48,), gain, 1e-6)
    gate, up = (hidden @ gate_up.t()).chunk(2, -1)
    ref = x + (torch.nn.functional.silu(gate) * up) @ down.t()
    h = fused_linear(x, (gate_up * gain).contiguous(), norm_eps=1e-6, glu=True)
    assert h.shape == (7, 40)
    out = fused_linear(h, down, residual=x)
    torch.testing.assert_close(out, ref, atol=1e-4, rtol=1e-4)


@runs_kernels
def test_in_place_split_k_add_equals_the_residual_linear():
    pytest.importorskip("triton")
    from bench.fused_decode import add_linear_

    torch.manual_seed(3)
    x, a, w = _randn(6, 40), _randn(6, 96), _randn(40, 96)
    ref = x + a @ w.t()
    same = add_linear_(x, a, w)
    assert same is x  # in place
    torch.testing.assert_close(x, ref, atol=1e-4, rtol=1e-4)
    with pytest.raises(ValueError, match="float32 x"):
        add_linear_(x.half(), a.half(), w.half())


def _hopper() -> bool:
    return DEVICE == "cuda" and torch.cuda.get_device_capability()[0] >= 9


@runs_kernels
@pytest.mark.parametrize(
    ("pdl", "dtype", "f32_residual"),
    [
        (False, torch.float32, False),
        # not bfloat16: Triton's CPU interpreter computes it wrongly (its own kernels too)
        (False, torch.float16, False),
        (False, torch.float32, True),  # a float16 model would round its residual otherwise
        pytest.param(
            True,
            torch.float32,
            True,
            marks=pytest.mark.skipif(
                not _hopper(), reason="programmatic dependent launch needs a Hopper-class GPU"
            ),
        ),
    ],
)
def test_fused_decoder_picks_the_same_greedy_tokens_as_the_plain_decoder(
    tiny_llama, pdl, dtype, f32_residual
):
    pytest.importorskip("triton")
    import copy

    from bench.fused_decode import FusedGraphDecoder
    from components.lm.graph_decode import GraphDecoder

    model = copy.deepcopy(tiny_llama).to(DEVICE, dtype)
    torch.manual_seed(2)
    ids = torch.randint(3, model.config.vocab_size, (4, 12), device=DEVICE)
    mask = torch.ones_like(ids)
    mask[1, :3] = 0  # a left-padded row
    mask[3, :7] = 0

    def greedy(logits):
        return torch.argmax(logits, dim=-1), torch.log_softmax(logits.float(), -1).amax(-1)

    with torch.no_grad():
        plain = GraphDecoder(model, 4, 32, attention="torch", graphs=False)
        ref, ref_lp = plain.generate(ids, mask, max_new_tokens=10, pick=greedy)
        fused = FusedGraphDecoder(
            model, 4, 32, graphs=DEVICE == "cuda", pdl=pdl, f32_residual=f32_residual
        )
        out, lp = fused.generate(ids, mask, max_new_tokens=10, pick=greedy)
    assert torch.equal(out, ref)
    tol = 1e-4 if dtype == torch.float32 else 2e-2
    torch.testing.assert_close(lp, ref_lp, atol=tol, rtol=tol)
    assert len(set(ref.flatten().tolist())) > 3  # not a degenerate repeat of one token


@runs_kernels
def test_fused_decoder_refuses_what_it_does_not_fuse(tiny_llama):
    from bench.fused_decode import FusedGraphDecoder

    with pytest.raises(ValueError, match="no torch"):
        FusedGraphDecoder(tiny_llama, 2, 16, compile=True)


@pytest.mark.parametrize("pdl", [False, True])
def test_every_gemm_variant_compiles_for_hopper_without_a_gpu(pdl):
    """ptxas (shipped with triton) builds each variant for sm_90: no GPU time wasted on it."""
    triton = pytest.importorskip("triton")
    if _INTERPRET:
        pytest.skip("the interpreter does not compile")
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from bench.fused_decode import _add_kernel, _kernel

    pointers = {p: "*bf16" for p in ("a_ptr", "w_ptr", "bias_ptr", "res_ptr", "out_ptr")}
    ints = ("M", "N", "K", "stride_am", "stride_wn", "stride_rm", "stride_om")
    signature = {**pointers, **dict.fromkeys(ints, "i32"), "eps": "fp32"}
    # what the launcher specialises for SmolLM2's shapes: every pointer and int a multiple
    # of 16, which lets the K loop be software-pipelined (cp.async stages)
    aligned = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(signature) if name != "eps"}
    for glu, norm, residual in ((False, True, False), (True, True, False), (False, False, True)):
        constants = {
            "NORM": norm,
            "GLU": glu,
            "HAS_BIAS": not glu,
            "RESIDUAL": residual,
            "PDL": pdl,
            "PRECISION": "tf32",
            "BLOCK_M": 32,
            "BLOCK_N": 64,
            "BLOCK_K": 64,
        }
        source = ASTSource(
            fn=_kernel().fn,
            signature={**signature, **dict.fromkeys(constants, "constexpr")},
            constexprs=constants,
            attrs=aligned,
        )
        options = {"num_warps": 4, "num_stages": 3, "launch_pdl": pdl}
        compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        ptx = compiled.asm["ptx"]
        assert compiled.asm["cubin"] and "cp.async" in ptx
        assert ("griddepcontrol" in ptx) == pdl
    # the in-place residual GEMM: one writer, and split-K by float32 atomic adds
    add_signature = {"a_ptr": "*bf16", "w_ptr": "*bf16", "x_ptr": "*fp32"}
    add_signature |= dict.fromkeys(("M", "N", "K", "stride_am", "stride_wn", "stride_xm"), "i32")
    for split in (1, 4):
        constants = {
            "PDL": pdl,
            "PRECISION": "tf32",
            "BLOCK_M": 32,
            "BLOCK_N": 64,
            "BLOCK_K": 64,
            "SPLIT_K": split,
        }
        source = ASTSource(
            fn=_add_kernel().fn,
            signature={**add_signature, **dict.fromkeys(constants, "constexpr")},
            constexprs=constants,
            attrs={(i,): [["tt.divisibility", 16]] for i in range(len(add_signature))},
        )
        options = {"num_warps": 4, "num_stages": 3, "launch_pdl": pdl}
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]
        assert "cp.async" in ptx
        # a word boundary: cp.async's "shared.global" contains "red.global"
        atomics = re.search(r"\b(atom|red)\.global", ptx) is not None
        assert atomics == (split > 1)
