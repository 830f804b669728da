"""QuantLinear's operands equal the dequantised NumPy recipes bit for bit (tolerance 0).

Each test feeds the same float32 input (and, for stochastic NVFP4, the same seed) to the
operand path of a real `QuantLinear` (`quantize_operand`) and to the NumPy recipe
of [normlab.precision][], and compares the float32 bit patterns. Inputs span 16 binades
so block scales differ, with a zero block and lengths that are not block multiples.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.precision import (  # noqa: E402
    DelayedScaling,
    Fp8Meta,
    blockwise_quantize,
    mx_dequantize,
    mx_quantize,
    nvfp4_quantize,
    quantize_current_scaling,
)
from normlab.torch import QuantLinear  # noqa: E402
from normlab.torch.recipes import (  # noqa: E402
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    MXRecipe,
    NVFP4Recipe,
)
from normlab.torch.training._gemm import quantize_operand, stream_seed  # noqa: E402


def _x(rng: np.random.Generator, shape: tuple[int, int] = (40, 72)) -> np.ndarray:
    x = rng.standard_normal(shape) * np.exp2(rng.uniform(-8, 8, (shape[0], 1)))
    x = x.astype(np.float32)
    x[2, :] = 0.0  # zero blocks along both axes' tilings
    return x


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def _layer(recipe: object) -> QuantLinear:
    return QuantLinear(72, 40, recipe=recipe)


def _operand(layer: QuantLinear, x: np.ndarray, role: str, axis: int,
             step: int | None = None) -> np.ndarray:
    """The layer's operand; with `step`, rounded stochastically by stream 0 of that step."""
    t = torch.from_numpy(x)
    if step is None:
        return quantize_operand(layer, t, role, axis).numpy()
    return quantize_operand(layer, t, role, axis, step=torch.tensor(step), which=0).numpy()


@pytest.mark.parametrize("axis", [0, 1])
@pytest.mark.parametrize("step", [None, 12345])
def test_nvfp4_1d_operand_is_numpy_nvfp4(axis: int, step: int | None, rng) -> None:
    x = _x(rng)
    layer = _layer(NVFP4Recipe())
    got = _operand(layer, x, "dy", axis, step)
    seed = None if step is None else stream_seed(layer.seed, step, 0)
    mode = "nearest" if seed is None else "stochastic"
    want = nvfp4_quantize(x, axis=axis, rounding=mode, seed=seed).dequantize()
    np.testing.assert_array_equal(_bits(got), _bits(want))


def test_nvfp4_2d_weight_operand_is_numpy_nvfp4(rng) -> None:
    x = _x(rng)
    layer = _layer(NVFP4Recipe(two_d_weights=True))
    want = nvfp4_quantize(x, block_shape=(16, 16)).dequantize()
    for axis in (0, 1):  # 16 x 16 tiles: W and W^T quantise alike
        np.testing.assert_array_equal(_bits(_operand(layer, x, "w", axis)), _bits(want))


def test_nvfp4_operand_on_the_value_where_scale_orders_differ() -> None:
    # a block of amax 1 beside a tensor amax of 2352 (S_enc = 8/7, not a power of two):
    # the block and element scales must be formed in the recipe's operation order
    x = np.zeros((1, 32), np.float32)
    x[0, :16] = np.linspace(-1.0, 1.0, 16, dtype=np.float32)
    x[0, 16] = np.float32(2688.0 * 7 / 8)
    got = _operand(_layer(NVFP4Recipe()), x, "x", 1)
    want = nvfp4_quantize(x, axis=1).dequantize()
    np.testing.assert_array_equal(_bits(got), _bits(want))


@pytest.mark.parametrize("axis", [0, 1])
def test_mx_operand_is_numpy_mx(axis: int, rng) -> None:
    x = _x(rng, (64, 96))
    layer = QuantLinear(96, 64, recipe=MXRecipe(elem="e4m3", grad_elem="e5m2"))
    for role, elem in (("x", "e4m3"), ("dy", "e5m2")):
        want = mx_dequantize(mx_quantize(x, elem, block_size=32, axis=axis))
        np.testing.assert_array_equal(_bits(_operand(layer, x, role, axis)), _bits(want))


def test_current_scaling_operand_is_numpy_current_scaling(rng) -> None:
    x = _x(rng)
    layer = _layer(Fp8CurrentRecipe(margin=1, reduce_amax=False))  # HYBRID: e4m3 / e5m2
    for role, fmt in (("x", "e4m3"), ("dy", "e5m2")):
        want = quantize_current_scaling(x, fmt, margin=1).dequantize()
        np.testing.assert_array_equal(_bits(_operand(layer, x, role, 0)), _bits(want))


def test_delayed_scaling_operand_follows_numpy_fp8meta(rng) -> None:
    # three steps of quantise-then-update; the scale comes from the amax history
    recipe = Fp8DelayedRecipe(margin=1, amax_history_len=2, reduce_amax=False)
    layer = _layer(recipe)
    meta = Fp8Meta(DelayedScaling(margin=1, amax_history_len=2), role="forward")
    for step in range(3):
        x = _x(rng) * np.float32(4.0**step)
        got = _operand(layer, x, "x", 1)
        want = meta.quantize(x).dequantize()
        np.testing.assert_array_equal(_bits(got), _bits(want))
        layer.update_scales()
        meta.update()
        assert float(layer.scale[0]) == meta.scale


@pytest.mark.parametrize("axis", [0, 1])
def test_blockwise_operands_are_numpy_blockwise(axis: int, rng) -> None:
    x = _x(rng, (40, 72))
    layer = _layer(BlockwiseFp8Recipe(block_size=16))
    moved = np.ascontiguousarray(np.moveaxis(x, axis, -1))
    want = np.moveaxis(blockwise_quantize(moved, block_shape=(1, 16)).dequantize(), -1, axis)
    np.testing.assert_array_equal(_bits(_operand(layer, x, "x", axis)), _bits(want))
    want_w = blockwise_quantize(x, block_shape=(16, 16)).dequantize()
    np.testing.assert_array_equal(_bits(_operand(layer, x, "w", axis)), _bits(want_w))
