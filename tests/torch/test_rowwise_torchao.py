"""FP8 rowwise recipes against torchao's own code (the outside reference).

Operands: each operand of `Fp8RowwiseRecipe` (its quantizer for a role and contraction
axis) against torchao's axis-wise cast `hp_tensor_to_float8_dynamic(...,
ScalingGranularity.AXISWISE, axiswise_dim, round_scales_to_power_of_2=True)`: the E4M3
data, the scales and the dequantised values bit for bit, on the CPU kernels and on the
torch path. Layers: `convert(model, Fp8RowwiseRecipe(...))` against
`convert_to_float8_training(model, config=Float8LinearConfig.from_recipe_name(...),
emulate=True)` on the same weights and data.

Differences, each explained and tested here:

1. A slice holding an inf or a NaN: torchao's scale is 448 / inf = 0 (or NaN), its data
   `inf * 0` = NaN next to zeros, and dequantising (data / 0) gives a NaN slice. normlab's
   scale is NaN and its data all NaN: the dequantised slice is the same all-NaN slice, so
   those slices are compared by value only.
2. torchao rounds a scale down to a power of two as `exp2(floor(log2(s)))` with `log2`
   in float32, which rounds to the next integer when `s` lies a few float32 ulps below a
   power of two; normlab clears the mantissa bits (the exact floor). Detected at run time
   on a constructed amax: where torchao's scale is the power above, it saturates the
   slice's largest element.
3. torchao forms `448 / amax` in float64 and rounds to float32; normlab divides in
   float32. After the power-of-two floor these differ only in case 2.
4. Layers of a bfloat16 model: torchao rounds the product to bfloat16 and then adds the
   bias in bfloat16 (two roundings); normlab adds the bias in float32 and rounds once. The
   outputs differ by at most half a bfloat16 ulp of the product before the bias plus one of
   the larger output (tolerance below). Gradients have no bias term.

Tolerance of the layer comparisons (float32 models: accumulation order only):
`|a - b| <= (K + 1) eps32 (|x| |W|^T + |b|) * 2`, the float32 dot-product bound with
quantised operands at most 1 + 2^-4 times their inputs (E4M3 rounding), for both sides;
bfloat16 models add `2^-7 max(|a|, |b|)` (one bfloat16 ulp of the larger) and, for the
output, `2^-8 |x| |W|^T` (torchao's rounding of the product before its bias).
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchao_float8 = pytest.importorskip("torchao.float8")

from torchao.float8.config import (  # noqa: E402
    Float8LinearConfig,
    ScalingGranularity,
)
from torchao.float8.float8_scaling_utils import hp_tensor_to_float8_dynamic  # noqa: E402
from torchao.float8.float8_training_tensor import LinearMMConfig  # noqa: E402

from normlab import _backend  # noqa: E402
from normlab.precision import quantize_current_scaling  # noqa: E402
from normlab.precision.operands.codes import element_values  # noqa: E402
from normlab.precision.scaled.namespace import NUMPY  # noqa: E402
from normlab.torch import Fp8RowwiseRecipe, convert  # noqa: E402
from normlab.torch import quantize_current_scaling as t_current  # noqa: E402
from normlab.torch.training import _operand_ops as ops  # noqa: E402

_EPS32 = float(np.finfo(np.float32).eps)
PATHS = ("kernels", "torch_ops")


def _rows(shape: tuple[int, int], seed: int) -> np.ndarray:
    """Rows over 12 binades, a zero row, a tiny (1e-30) and a huge (1e30) row."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal(shape) * np.exp2(rng.integers(-6, 7, size=(shape[0], 1)))
    x[1, :] = 0.0
    x[2, :] *= 1e-30
    x[3, :] *= 1e30
    return x.astype(np.float32)


def _torchao(t: torch.Tensor, dim: int):
    """torchao's axis-wise E4M3 cast of `t` (2-D), scaled along `dim` (it takes 0 or -1)."""
    return hp_tensor_to_float8_dynamic(
        t, torch.float8_e4m3fn, LinearMMConfig(),
        scaling_granularity=ScalingGranularity.AXISWISE, axiswise_dim=0 if dim == 0 else -1,
        round_scales_to_power_of_2=True)


def _ours(t: torch.Tensor, q, path: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(E4M3 data, scale, dequantised values) of the layer's operand `t` under `q`."""
    with _backend.use_backend("numpy" if path == "torch_ops" else "numba"):
        values = ops.fake(t, q)
        codes, inv, _ = ops.encode(t, q)
    stored = torch.from_numpy(np.asarray(element_values(codes.numpy(), q.fmt, NUMPY)))
    data = stored if not ops.operand_order(q, t) == "F" else stored.t()
    # the scale grid of an axis-0 operand is that of its transpose: (C, 1) -> (1, C)
    scale = 1.0 / (inv.t() if q.axis == 0 else inv)
    return data, scale, values


def _bits(a: torch.Tensor) -> np.ndarray:
    return a.to(torch.float32).contiguous().numpy().view(np.uint32)


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("shape", [(40, 72), (24, 40)])
def test_operands_equal_torchaos_axiswise_cast(path: str, axis: int, shape) -> None:
    t = torch.from_numpy(_rows(shape, 3))
    q = Fp8RowwiseRecipe().quantizer("x", axis)
    want = _torchao(t, axis)
    data, scale, values = _ours(t, q, path)
    np.testing.assert_array_equal(_bits(data), _bits(want._data.to(torch.float32)))
    np.testing.assert_array_equal(_bits(scale), _bits(want._scale))
    np.testing.assert_array_equal(_bits(values), _bits(want.to_original_precision()))


@pytest.mark.parametrize("path", PATHS)
def test_a_nonfinite_row_dequantises_to_nan_as_in_torchao(path: str) -> None:
    # difference 1: the same all-NaN slices, by value (torchao's data keeps zeros there)
    x = _rows((24, 40), 5)
    x[4, 7], x[6, 3] = np.inf, np.nan
    t = torch.from_numpy(x)
    q = Fp8RowwiseRecipe().quantizer("x", 1)
    want = _torchao(t, 1).to_original_precision()
    _, _, values = _ours(t, q, path)
    assert torch.isnan(values[4]).all() and torch.isnan(values[6]).all()
    assert torch.isnan(want[4]).all() and torch.isnan(want[6]).all()
    finite = [r for r in range(24) if r not in (4, 6)]
    np.testing.assert_array_equal(_bits(values[finite]), _bits(want[finite]))


def test_scale_floor_below_a_power_of_two() -> None:
    # difference 2: 448 / amax a few float32 ulps below 2^8; normlab's floor is 2^7
    amax = np.float32(1.75) * np.float32(1 + 2**-22)
    x = torch.tensor([[float(amax), 1.0, -0.5]])
    theirs = float(_torchao(x, 1)._scale)
    ours = float(_ours(x, Fp8RowwiseRecipe().quantizer("x", 1), "kernels")[1])
    assert ours == 128.0  # float32(448 / amax) < 256: the power of two below
    if theirs == 256.0:  # torchao's float32 log2 rounded up: its largest element saturates
        assert float(_torchao(x, 1)._data[0, 0].float()) == 448.0
    else:
        assert theirs == ours


@pytest.mark.parametrize("axis", [None, 0, 1, -1])
def test_axiswise_current_scaling_twins_equal_torchao(axis) -> None:
    x = _rows((24, 40), 7)
    kw = {"amax_epsilon": 1e-12, "power_of_2_scales": True, "axis": axis}
    a, b = quantize_current_scaling(x, "e4m3", **kw), t_current(torch.from_numpy(x), "e4m3", **kw)
    np.testing.assert_array_equal(a.dequantize().view(np.uint32), _bits(b.dequantize()))
    np.testing.assert_array_equal(np.asarray(a.scale, np.float32), b.scale.numpy())
    if axis is not None:
        want = _torchao(torch.from_numpy(x), axis)
        np.testing.assert_array_equal(np.asarray(a.scale, np.float32), want._scale.numpy())
        np.testing.assert_array_equal(a.data, want._data.to(torch.float32).numpy())


def test_axis_out_of_range_is_a_value_error() -> None:
    with pytest.raises(ValueError, match="axis"):
        quantize_current_scaling(np.ones((2, 3), np.float32), axis=2)
    with pytest.raises(TypeError, match="axis"):
        t_current(torch.ones(2, 3), axis=1.0)


def _models(dtype: torch.dtype, high_precision: bool, k: int):
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(k, 48)).to(dtype)
    ours = convert(copy.deepcopy(base), Fp8RowwiseRecipe(high_precision), keep_lm_head=False)
    name = "rowwise_with_gw_hp" if high_precision else "rowwise"
    config = Float8LinearConfig.from_recipe_name(name)
    config = Float8LinearConfig(**{**config.__dict__, "emulate": True})
    theirs = torchao_float8.convert_to_float8_training(copy.deepcopy(base), config=config)
    return ours, theirs


def _run(model, x: torch.Tensor, dy: torch.Tensor):
    xx = x.clone().requires_grad_(True)
    y = model(xx)
    y.backward(dy)
    return y.detach(), xx.grad, model[0].weight.grad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("high_precision", [False, True], ids=["rowwise", "gw_hp"])
@pytest.mark.parametrize("lead", [(24,), (3, 8)], ids=["2d", "3d"])
def test_layers_match_torchao_emulation(dtype, high_precision, lead) -> None:
    k = 72  # not a multiple of 16
    ours, theirs = _models(dtype, high_precision, k)
    x = torch.from_numpy(_rows((int(np.prod(lead)), k), 11)).reshape(*lead, k).to(dtype)
    rng = np.random.default_rng(13)
    dy = torch.from_numpy(rng.standard_normal((int(np.prod(lead)), 48)).astype(np.float32))
    dy = dy.reshape(*lead, 48).to(dtype)
    got, want = _run(ours, x, dy), _run(theirs, x, dy)
    w, b = ours[0].weight.detach().float(), ours[0].bias.detach().float()
    x2, dy2 = x.reshape(-1, k).float(), dy.reshape(-1, 48).float()
    bounds = [(k + 1) * _EPS32 * 2 * (x2.abs() @ w.abs().t() + b.abs()),  # y
              (49) * _EPS32 * 2 * (dy2.abs() @ w.abs()),  # dx
              (x2.shape[0] + 1) * _EPS32 * 2 * (dy2.abs().t() @ x2.abs())]  # dW
    for name, a, e, bound in zip(("y", "dx", "dW"), got, want, bounds, strict=True):
        a2, e2 = a.float().reshape(bound.shape), e.float().reshape(bound.shape)
        tol = bound
        if dtype == torch.bfloat16:
            tol = bound + 2.0**-7 * torch.maximum(a2.abs(), e2.abs())
            if name == "y":
                tol = tol + 2.0**-8 * (x2.abs() @ w.abs().t())
        finite = torch.isfinite(e2)
        assert torch.equal(torch.isfinite(a2), finite), name
        excess = ((a2 - e2).abs() - tol)[finite]
        assert (excess <= 0).all(), (name, float(excess.max()))
