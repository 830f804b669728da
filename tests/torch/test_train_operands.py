"""The operand quantisers of QuantLinear against normlab's NumPy rounding and recipes.

Every comparison is exact (tolerance 0): the fast paths must round exactly as
`normlab.precision.quantize`, and the scaled operands must equal the dequantised NumPy
recipes (`mx_quantize`, `quantize_current_scaling`) bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.precision import (  # noqa: E402
    decode,
    get_format,
    mx_dequantize,
    mx_quantize,
    quantize,
    quantize_current_scaling,
)
from normlab.precision.scaled.hadamard import rht_matrix  # noqa: E402
from normlab.precision.scaled.quantizers import (  # noqa: E402
    Fp8BlockQuantizer,
    Fp8TensorQuantizer,
    MXQuantizer,
)
from normlab.torch._fastround import round_elements  # noqa: E402
from normlab.torch.training import _operand_ops as ops  # noqa: E402
from normlab.torch.training._operand_ops import hadamard_rows  # noqa: E402

FAST = ["bf16", "fp16", "e4m3", "e5m2", "fp4"]


def _inputs(fmt_name: str, rng: np.random.Generator) -> np.ndarray:
    """Every float32 with a bf16 prefix (low half 0 / tie / below / above), every midpoint
    between neighbouring values of the format and the floats either side, specials."""
    top = np.arange(2**16, dtype=np.uint32) << np.uint32(16)
    parts = [(top | low).view(np.float32) for low in (0, 0x8000, 0x7FFF, 0x8001)]
    fmt = get_format(fmt_name)
    codes = np.arange(2 ** fmt.bits, dtype=np.uint64)
    values = np.unique(decode(codes, fmt).astype(np.float64))
    values = values[np.isfinite(values)]
    mids = ((values[1:] + values[:-1]) / 2).astype(np.float32)  # exact in float32
    parts += [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, -np.inf),
              rng.standard_normal(4096).astype(np.float32) * 10.0,
              np.array([np.inf, -np.inf, np.nan, 0.0, -0.0], np.float32)]
    return np.concatenate(parts)


@pytest.mark.parametrize("saturate", [True, False])
@pytest.mark.parametrize("fmt_name", FAST)
def test_fast_rounding_is_quantize(fmt_name: str, saturate: bool, rng) -> None:
    x = _inputs(fmt_name, rng)
    fmt = get_format(fmt_name)
    with np.errstate(over="ignore", invalid="ignore"):
        want = quantize(x, fmt, saturate=saturate)
    got = round_elements(torch.from_numpy(x), fmt, saturate=saturate).numpy()
    np.testing.assert_array_equal(got.view(np.uint32), want.view(np.uint32))


@pytest.mark.parametrize("elem", ["e4m3", "e5m2", "fp4"])
@pytest.mark.parametrize("axis", [0, 1])
def test_mx_blocks_equal_numpy_mx(elem: str, axis: int, rng) -> None:
    x = (rng.standard_normal((64, 96)) * np.exp(rng.uniform(-8, 8, (64, 1)))).astype(np.float32)
    x[3, :] = 0.0  # zero blocks
    want = mx_dequantize(mx_quantize(x, elem, block_size=32, axis=axis))
    got = ops.fake(torch.from_numpy(x), MXQuantizer(get_format(elem), axis, 32)).numpy()
    np.testing.assert_array_equal(got, want)


@pytest.mark.parametrize("fmt_name", ["e4m3", "e5m2"])
def test_per_tensor_equals_current_scaling(fmt_name: str, rng) -> None:
    x = (rng.standard_normal((48, 40)) * 1e-3).astype(np.float32)
    t = quantize_current_scaling(x, fmt_name, margin=1)
    fmt = get_format(fmt_name)
    got = ops.fake(torch.from_numpy(x), Fp8TensorQuantizer(fmt),
                   scale=torch.tensor(t.scale)).numpy()
    np.testing.assert_array_equal(got, t.dequantize())


def test_block_scaled_one_by_k_is_per_row_current_scaling(rng) -> None:
    # a 1x16 tile with a float32 scale is current scaling of that tile (DeepSeek's rule)
    x = rng.standard_normal((8, 32)).astype(np.float32) * np.float32(3.0)
    got = ops.fake(torch.from_numpy(x), Fp8BlockQuantizer(get_format("e4m3"), 1, 16)).numpy()
    want = np.concatenate([quantize_current_scaling(x[r, c:c + 16], "e4m3").dequantize()
                           for r in range(8) for c in (0, 16)]).reshape(8, 32)
    np.testing.assert_allclose(got, want, rtol=0, atol=0)


def test_hadamard_is_orthogonal_and_cancels_in_the_product(rng) -> None:
    # (H dy)^T (H x) = dy^T x up to float32 rounding of the two extra products: rtol 1e-5
    dy = torch.from_numpy(rng.standard_normal((40, 6)).astype(np.float32))
    x = torch.from_numpy(rng.standard_normal((40, 5)).astype(np.float32))
    m = torch.from_numpy(rht_matrix(16, 5).astype(np.float32))
    hd, hx = hadamard_rows(dy, m), hadamard_rows(x, m)
    assert hd.shape == (48, 6)  # M padded to a multiple of 16
    torch.testing.assert_close(hd.t() @ hx, dy.t() @ x, rtol=1e-5, atol=1e-5)
    eye = hadamard_rows(torch.eye(16), m)
    torch.testing.assert_close(eye.t() @ eye, torch.eye(16), rtol=0, atol=1e-6)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16", "float64"])
def test_tensor_amax_equals_the_reference(dtype: str, rng) -> None:
    # the layer's per-tensor amax (numba's one pass for float32/bfloat16, torch otherwise)
    # against max |x| in float64 of the same values: exact, a max is one of the inputs
    from normlab.torch.training._operand_ops import tensor_amax

    dt = getattr(torch, dtype)
    base = torch.from_numpy(rng.standard_normal((300, 517)) * 10).to(dt)
    with_inf = base.clone()
    with_inf[5, 3] = -torch.inf
    cases = {"plain": base, "transposed": base.t(), "negative": -base.abs(),
             "zeros": base * 0, "inf": with_inf}
    for name, x in cases.items():
        got = tensor_amax(x)
        want = x.to(torch.float64).abs().max()
        assert got.dtype == (torch.float64 if dtype == "float64" else torch.float32), name
        assert float(got) == float(want), (name, float(got), float(want))
    with_nan = base.clone()
    with_nan[7, 11] = torch.nan
    assert torch.isnan(tensor_amax(with_nan))
