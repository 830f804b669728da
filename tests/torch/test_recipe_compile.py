"""torch.compile of the shared recipe arithmetic: one graph, no host syncs, eager's bits.

Every piece of recipe arithmetic runs on tensors through the torch namespace. Traced by
Dynamo it must give one graph with no break (a ``.item()``, a NumPy call or Python
branching on a tensor value would break it), and the compiled function, by the
``aot_eager`` and the default ``inductor`` backends, must return eager's bits (tolerance 0:
the same IEEE float32/float64 and integer operations; inductor does not reassociate float
arithmetic).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")

from normlab.precision import get_format  # noqa: E402
from normlab.precision.scaled import arithmetic as recipe_core  # noqa: E402
from normlab.precision.scaled import block_scales, scales  # noqa: E402
from normlab.precision.scaled import tiling as blocks  # noqa: E402
from normlab.precision.scaled.recipes import (  # noqa: E402
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    MXRecipe,
    NVFP4Recipe,
)
from normlab.torch import QuantLinear  # noqa: E402
from normlab.torch.namespace import TORCH  # noqa: E402

# Dynamo instantiates the autograd.Function internally while tracing (a torch-side warning)
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*should not be instantiated:DeprecationWarning")

E4M3, FP4 = get_format("e4m3"), get_format("fp4")


def _x() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(40, 72, generator=g) * 2.0 ** torch.randint(-20, 12, (40, 1), generator=g)
    x[0, :4] = torch.tensor([float("inf"), float("nan"), -0.0, 1e-40])
    x[5, :] = 0.0
    return x


def _scales(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    amax = x.abs().amax(dim=1)  # 40
    s = scales.scale_from_amax(amax, 448.0, margin=2, epsilon=1e-3, power_of_2_scales=True,
                               previous=torch.full_like(amax, 3.0), xp=TORCH)
    h = torch.stack([amax[:8], x[1, :8].abs()])  # 2,8 histories
    h = scales.record_amax(h, amax[8:10], xp=TORCH)
    fused = scales.delayed_update(h, s[:2], 448.0, margin=1, xp=TORCH)
    unfused = scales.delayed_update(h, s[:2], 57344.0, amax_compute_algo="most_recent",
                                    update="unfused", xp=TORCH)
    return (s, h, *fused, *unfused)


def _block_scales(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    amax = blocks.block_amax(x, (16,), xp=TORCH)
    codes = [block_scales.mx_scale_codes(amax, E4M3, rule, xp=TORCH)
             for rule in ("ocp", "round_up")]
    nv = block_scales.nvfp4_scales(amax, amax.abs().amax(), xp=TORCH)
    bw = block_scales.blockwise_scales(amax, E4M3, power_of_2_scales=True, xp=TORCH)
    return (*codes, *nv, bw, blocks.spread(bw, (16,), tuple(x.shape), xp=TORCH))


def _parts(x: torch.Tensor) -> tuple[torch.Tensor, ...]:
    mx = recipe_core.mx_quantize_parts(x, E4M3, block_size=32, axis=0, rule="ocp", xp=TORCH)
    nv = recipe_core.nvfp4_quantize_parts(x, block=(16, 16), axis=-1, xp=TORCH)
    bw = recipe_core.blockwise_quantize_parts(x, E4M3, block=(1, 32), xp=TORCH)
    s = recipe_core.current_scale(x, E4M3, margin=1, xp=TORCH)
    pt = recipe_core.per_tensor_quantize(x, E4M3, s, xp=TORCH)
    return (*mx, recipe_core.mx_dequantize_values(*mx, block_size=32, axis=0, xp=TORCH),
            *nv, recipe_core.nvfp4_dequantize_values(*nv, block=(16, 16), axis=-1, xp=TORCH),
            *bw, *pt)


PIECES = {"scales": _scales, "block_scales": _block_scales, "parts": _parts}


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bit patterns; a NaN equals any NaN (IEEE 754 leaves NaN payloads to the
    implementation, and eager and inductor kernels propagate different ones)."""
    if not a.dtype.is_floating_point:
        return torch.equal(a, b)
    view = torch.int64 if a.dtype == torch.float64 else torch.int32
    nan = torch.isnan(a)
    if not torch.equal(nan, torch.isnan(b)):
        return False
    zero = torch.zeros_like(a)
    return torch.equal(torch.where(nan, zero, a).view(view), torch.where(nan, zero, b).view(view))


@pytest.mark.parametrize("name", sorted(PIECES))
def test_shared_arithmetic_traces_as_one_graph(name: str) -> None:
    dynamo.reset()
    ex = dynamo.explain(PIECES[name])(_x())
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons


@pytest.mark.filterwarnings("ignore:.*script_method. is deprecated:DeprecationWarning")
@pytest.mark.parametrize("backend", ["aot_eager", "inductor"])
@pytest.mark.parametrize("name", sorted(PIECES))
def test_compiled_shared_arithmetic_equals_eager_bitwise(name: str, backend: str) -> None:
    dynamo.reset()
    fn, x = PIECES[name], _x()
    want = fn(x)
    got = torch.compile(fn, backend=backend, fullgraph=True)(x)
    assert len(got) == len(want)
    for i, (g, w) in enumerate(zip(got, want, strict=True)):
        assert g.dtype == w.dtype and _same_bits(g, w), (name, i)


LAYERS = {
    "delayed_unfused": Fp8DelayedRecipe(amax_history_len=4, update="unfused", reduce_amax=False),
    "current_pow2": Fp8CurrentRecipe(power_of_2_scales=True, reduce_amax=False),
    "mx_round_up": MXRecipe("fp4", scale_rule="round_up"),
    # stochastic gradients advance a Python counter of the layer in backward (a graph
    # break under compile, outside the recipe arithmetic); the rest of NVFP4 traces
    "nvfp4_2d_rht": NVFP4Recipe(stochastic_gradients=False),
    "blockwise": BlockwiseFp8Recipe(block_size=32),
}


@pytest.mark.parametrize("name", sorted(LAYERS))
def test_quantlinear_forward_traces_as_one_graph(name: str) -> None:
    torch.manual_seed(0)
    layer = QuantLinear(72, 24, recipe=LAYERS[name])
    dynamo.reset()
    ex = dynamo.explain(layer)(_x()[6:].clamp(-8.0, 8.0))
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons


def test_no_value_is_read_back_on_the_host() -> None:
    # a host read (.item(), bool(tensor)) inside the shared arithmetic would be a graph
    # break with this reason; the traced pieces above have none, and math.isfinite on a
    # tensor (a typical slip) is one
    def slip(x: torch.Tensor) -> torch.Tensor:
        a = x.abs().amax()
        return x * 2.0 if math.isfinite(a) else x

    dynamo.reset()
    assert dynamo.explain(slip)(_x().nan_to_num()).graph_break_count == 1
