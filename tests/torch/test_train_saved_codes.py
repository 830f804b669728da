"""QuantLinear saves its wgrad input as codes plus scales, and backward is unchanged by it.

Saved bytes are counted with [saved_bytes][normlab.bench.memory.saved_bytes] on a bfloat16
layer (M = 40 rows, K = 64 inputs; parameters excluded) and compared with what the
format holds: one byte per FP8 code, half a byte per E2M1 code (NVFP4 after its Hadamard
transform pads M to 48), two bytes per bfloat16 code, plus one scale per block (E8M0
and E4M3 scales one byte, blockwise FP8's float32 inverse scales four) and the float32
per-tensor scales. No saved tensor is a floating-point copy of x.

Backward with the saved codes equals, bit for bit, backward with the old saved float
copy: the same layer with its wgrad operand replaced by the reference operand function
(`fake_operand` in the recipes' shared arithmetic) of the float32 input.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab import _backend  # noqa: E402
from normlab.bench.memory import saved_bytes  # noqa: E402
from normlab.precision.operands import operand as po  # noqa: E402
from normlab.torch import QuantLinear  # noqa: E402
from normlab.torch.namespace import TORCH  # noqa: E402
from normlab.torch.recipes import (  # noqa: E402
    Bf16Recipe,
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    MXRecipe,
    NVFP4Recipe,
)
from normlab.torch.training import _gemm  # noqa: E402
from normlab.torch.training._operand_ops import hadamard_rows  # noqa: E402

M, K, N = 40, 64, 48
F32 = 4  # bytes of one float32 scale

# expected saved bytes from the formats: codes + block scales + per-tensor scales
EXPECTED = {
    "bf16": (Bf16Recipe(), M * K * 2),
    "delayed": (Fp8DelayedRecipe(reduce_amax=False), M * K + 2 * F32),  # x's and W's scale
    "current": (Fp8CurrentRecipe(reduce_amax=False), M * K + 2 * F32),
    "mx": (MXRecipe(), M * K + 2 * K),  # blocks of 32 along M: ceil(40 / 32) = 2 per column
    "nvfp4": (NVFP4Recipe(), 48 * K // 2 + 3 * K + F32),  # E4M3 per 16 rows, tensor scale
    "blockwise": (BlockwiseFp8Recipe(block_size=32), M * K + 2 * K * F32),
}


def _layer(recipe: object, dtype: torch.dtype) -> QuantLinear:
    # exact_gemm: the float32 GEMMs, so a bfloat16 layer's gradients from codes and from a
    # float copy compare bit for bit (the bfloat16 GEMM has its own tests)
    torch.manual_seed(0)
    return QuantLinear(K, N, recipe=recipe, exact_gemm=True, dtype=dtype).train()


def _x(dtype: torch.dtype) -> torch.Tensor:
    return (torch.randn(M, K, generator=torch.Generator().manual_seed(1)) * 3).to(dtype)


def _saved(layer: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    kept: list[torch.Tensor] = []

    def pack(t: torch.Tensor) -> torch.Tensor:
        kept.append(t)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        layer(x.requires_grad_())
    return kept


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_saved_bytes_are_codes_plus_scales(name: str) -> None:
    recipe, want = EXPECTED[name]
    layer = _layer(recipe, torch.bfloat16)
    x = _x(torch.bfloat16)
    _, got = saved_bytes(lambda: layer(x.requires_grad_()), exclude=list(layer.parameters()))
    assert got == want
    plain = torch.nn.Linear(K, N, dtype=torch.bfloat16)
    _, plain_bytes = saved_bytes(lambda: plain(x), exclude=list(plain.parameters()))
    assert plain_bytes == M * K * 2  # the unconverted layer keeps x in bfloat16
    for t in _saved(layer, x):
        if t.numel() >= M * K // 2 and t is not layer.weight:  # the codes, not a float copy
            assert not t.is_floating_point(), (t.dtype, tuple(t.shape))


def _reference_saved(layer: QuantLinear, x: torch.Tensor) -> _gemm.SavedOperand:
    """The old saved operand: q(x)_M as float32 values, from the reference functions."""
    r = layer.recipe
    spec = r.quantizer("x", 0)
    scale = layer.scale[0].clone() if layer.scale is not None else None
    src = x.to(torch.float32)
    if isinstance(r, NVFP4Recipe) and r.hadamard:
        src = hadamard_rows(src, layer.hadamard_matrix)
    with _backend.use_backend("numpy"):
        values = po.fake_operand(src, spec, scale=scale, xp=TORCH)
    return _gemm.SavedOperand((values, torch.empty(0), torch.empty(0)), spec,
                              tuple(values.shape), "C")


def _grads(layer: QuantLinear, x: torch.Tensor) -> list[torch.Tensor]:
    xx = x.clone().requires_grad_()
    dy = torch.randn(M, N, generator=torch.Generator().manual_seed(2)).to(x.dtype)
    layer(xx).backward(dy)
    return [xx.grad, layer.weight.grad, layer.bias.grad]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_backward_from_codes_equals_backward_from_a_float_copy(name, dtype, monkeypatch):
    recipe, _ = EXPECTED[name]
    layer = _layer(recipe, dtype)
    old = copy.deepcopy(layer)
    x = _x(dtype)
    new_grads = _grads(layer, x)
    monkeypatch.setattr(_gemm, "x_operands", lambda lay, xx, keep, bf16=False: (
        _gemm.quantize_operand(lay, xx, "x", axis=1), _reference_saved(lay, xx) if keep else None))
    monkeypatch.setattr(_gemm.SavedOperand, "values", lambda self: self.parts[0])
    old_grads = _grads(old, x)
    for a, b in zip(new_grads, old_grads, strict=True):
        assert a.dtype == b.dtype
        np.testing.assert_array_equal(a.float().numpy().view(np.uint32),
                                      b.float().numpy().view(np.uint32))


def test_a_bf16_layer_of_the_bf16_recipe_saves_x_itself() -> None:
    """On the bfloat16 GEMM path (no `exact_gemm`), the Bf16 recipe's x is its own
    quantisation: the layer keeps x itself for wgrad, as `torch.nn.Linear` does, not codes
    (2 bytes each either way, but no pass over x and no copy)."""
    torch.manual_seed(0)
    layer = QuantLinear(K, N, recipe=Bf16Recipe(), dtype=torch.bfloat16).train()
    x = _x(torch.bfloat16).requires_grad_()
    kept = [t for t in _saved(layer, x) if t.numel() == M * K]
    assert len(kept) == 1 and kept[0].data_ptr() == x.data_ptr()
    exact = QuantLinear(K, N, recipe=Bf16Recipe(), exact_gemm=True, dtype=torch.bfloat16)
    kept = [t for t in _saved(exact.train(), x) if t.numel() == M * K]
    assert len(kept) == 1 and kept[0].data_ptr() != x.data_ptr()  # the exact path: codes
