"""normlab.torch on CUDA: bit-identical to the CPU tensor path and to the NumPy reference,
dtype and device kept, seeds reproduce across devices, STE gradients stay on the GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import normlab.torch as nt
from normlab.precision import NAMED_FORMATS, RoundingMode, quantize

pytestmark = pytest.mark.cuda

MODES = [m.value for m in RoundingMode]


def _patterns(dtype: np.dtype, n: int = 2**16) -> np.ndarray:
    rng = np.random.default_rng(21)
    if dtype == np.float32:
        top = np.arange(2**16, dtype=np.uint32) << np.uint32(16)  # every exponent/top bits
        low = rng.integers(0, 2**16, size=2**16, dtype=np.uint32)
        low[::2] = 0  # exact ties
        return (top | low).view(np.float32)
    bits = rng.integers(0, 2**63, size=n, dtype=np.uint64)
    exponent = rng.integers(1023 - 180, 1023 + 140, size=n).astype(np.uint64)
    bits = (bits & np.uint64(0x800FFFFFFFFFFFFF)) | (exponent << np.uint64(52))
    return bits.view(np.float64)


@pytest.mark.parametrize("fmt", NAMED_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_gpu_equals_cpu_and_numpy(fmt, dtype):
    x = _patterns(np.dtype(dtype))
    ut = np.uint32 if dtype == np.float32 else np.uint64
    words = np.random.default_rng(5).integers(0, 2**64 - 1, size=x.size, dtype=np.uint64)
    for mode in MODES:
        for saturate in (False, True):
            kw_t = ({"random_bits": torch.from_numpy(words.view(np.int64)).cuda()}
                    if mode == "stochastic" else {})
            gpu = nt.quantize(torch.from_numpy(x).cuda(), fmt, rounding=mode,
                              saturate=saturate, **kw_t)
            assert gpu.is_cuda and gpu.dtype == torch.from_numpy(x).dtype
            kw_n = {"random_bits": words} if mode == "stochastic" else {}
            with np.errstate(over="ignore", invalid="ignore"):
                want = quantize(x, fmt, rounding=mode, saturate=saturate, **kw_n)
            cpu = nt.quantize(torch.from_numpy(x), fmt, rounding=mode, saturate=saturate,
                              **{k: v.cpu() for k, v in kw_t.items()})
            got = gpu.cpu().numpy().view(ut)
            assert np.array_equal(got, cpu.numpy().view(ut)), (fmt.name, mode, saturate)
            assert np.array_equal(got, want.view(ut)), (fmt.name, mode, saturate)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.float16])
def test_seed_gives_the_same_result_on_every_device(dtype):
    x = (torch.randn(257, 33, generator=torch.Generator().manual_seed(2)) * 10).to(dtype)
    cpu = nt.quantize(x, "e4m3", rounding="stochastic", seed=2**64 - 7)
    gpu = nt.quantize(x.cuda(), "e4m3", rounding="stochastic", seed=2**64 - 7)
    assert gpu.is_cuda and gpu.dtype == dtype
    assert torch.equal(gpu.cpu(), cpu)
    assert torch.equal(nt.stochastic_words(9, (5, 7), "cuda").cpu(), nt.stochastic_words(9, (5, 7)))


def test_ste_gradient_on_gpu():
    x = torch.randn(64, device="cuda", requires_grad=True)
    y = nt.quantize_ste(x, "e2m1")
    g = torch.randn(64, device="cuda")
    y.backward(g)
    assert x.grad is not None and x.grad.is_cuda and torch.equal(x.grad, g)
    assert torch.equal(y.detach().cpu(), nt.quantize(x.detach().cpu(), "e2m1"))


def test_specials_on_gpu():
    x = torch.tensor([float("nan"), -float("nan"), float("inf"), -float("inf"), 465.0, -0.0,
                      2**-10, 1.0 + 2**-4], device="cuda")
    for fmt in ("e4m3", "bf16", "e5m2", "fp16", "e2m1", "e8m0", "float8_e4m3fnuz"):
        for saturate in (False, True):
            got = nt.quantize(x, fmt, saturate=saturate).cpu().numpy().view(np.uint32)
            with np.errstate(over="ignore", invalid="ignore"):
                want = quantize(x.cpu().numpy(), fmt, saturate=saturate).view(np.uint32)
            assert np.array_equal(got, want), (fmt, saturate)
