r"""Correctness before timing, for the emulated-training benchmark.

A layer is checked against its recipe computed another way: a `QuantLinear(K, N, recipe)`
forward (float32) must equal the fake-quantised matmul of the NumPy recipe functions of
`normlab.precision` (`quantize`, `Fp8Meta`, `quantize_current_scaling`, `mx_quantize`,
`nvfp4_quantize`, `blockwise_quantize`), each operand quantised and dequantised as the
recipe's forward GEMM reads it: x in blocks along K, W along K (NVFP4 in 16 x 16 tiles,
blockwise FP8 in `block_size` squares). Delayed scaling runs two training forwards: the
first with the initial scale 1, the second with the scale of the recorded amaxes.
A checkpointed model ([checkpointed][normlab.bench.training_model.checkpointed]) is checked
against the same converted model without checkpointing: three training steps, losses and
final parameters bit for bit (a recomputed forward that differs from the original, or a
recipe state that counts it, shows in the gradients). torchao's float8 emulation is
checked the same way against its own definition: per-tensor
scale $s = \mathrm{float32}(448 / \mathrm{amax})$ (amax in float64), operand
$\mathrm{e4m3}_{sat}(x s) / s$.

Tolerance: the layer's float32 output $y$ against the float64 product $\hat y$ of the
reference operands $q_x$, $q_w$ and bias $b$, in units of the bound of a float32 dot
product of length $K$ plus the bias,

$$
|y - \hat y| \le (K + 1)\,\epsilon_{32}\,(|q_x|\,|q_w|^T + |b|),
$$

so a check passes at a value <= 1. A skipped rounding moves the output by a unit of the
operand format ($2^{-9}$ relative for bf16, $2^{-4}$ for E4M3) on every product, far
beyond $(K + 1)\,\epsilon_{32}$. `bit_identical` says whether the layer's output equals
the float32 matmul of the reference operands bit for bit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

import normlab.precision as p
import normlab.torch as nt

__all__ = ["CHECK_SHAPE", "checkpoint_check", "forward_error", "recipe_check",
           "reference_operands", "torchao_check"]

CHECK_SHAPE = (64, 256, 128)
"""(M, K, N) of the checked layer: K a multiple of every recipe's block (16, 32, 128)."""
_EPS32 = float(np.finfo(np.float32).eps)


def _data(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """x (M,K) with rows spread over 12 binades, W (N,K), b (N,), float32."""
    m, k, n = CHECK_SHAPE
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((m, k)) * np.exp2(rng.integers(-6, 7, size=(m, 1)))  # M,K
    w = rng.standard_normal((n, k)) * 0.05  # N,K
    b = rng.standard_normal(n) * 0.1  # N
    return x.astype(np.float32), w.astype(np.float32), b.astype(np.float32)


def _loaded(make: Callable[[int, int], Any], seed: int
            ) -> tuple[np.ndarray, np.ndarray, np.ndarray, Any]:
    """The checked data x, W, b and a `make(K, N)` linear layer that holds W and b."""
    x, w, b = _data(seed)
    layer = make(x.shape[1], w.shape[0])
    with torch.no_grad():
        layer.weight.copy_(torch.from_numpy(w))
        layer.bias.copy_(torch.from_numpy(b))
    return x, w, b, layer


def _delayed(recipe: Any, x: np.ndarray, w: np.ndarray) -> list[tuple[np.ndarray, ...]]:
    """Two forwards of delayed scaling: initial scale 1, then the scale of the amaxes."""
    settings = p.DelayedScaling(recipe.margin, recipe.amax_history_len,
                                recipe.amax_compute_algo, recipe.fp8_format)
    metas = [p.Fp8Meta(settings, "forward") for _ in range(2)]
    first = tuple(m.quantize(t).dequantize() for m, t in zip(metas, (x, w), strict=True))
    for m in metas:
        m.update()
    second = tuple(m.quantize(t).dequantize() for m, t in zip(metas, (x, w), strict=True))
    return [first, second]


_Operand = Callable[[Any, np.ndarray, bool], np.ndarray]


def _bf16(r: Any, t: np.ndarray, weight: bool) -> np.ndarray:
    return p.quantize(t, r.fmt)


def _current(r: Any, t: np.ndarray, weight: bool) -> np.ndarray:
    return p.quantize_current_scaling(t, r.format_for("forward"), margin=r.margin).dequantize()


def _rowwise(r: Any, t: np.ndarray, weight: bool) -> np.ndarray:
    return p.quantize_current_scaling(t, r.format_for("forward"), amax_epsilon=1e-12,
                                      power_of_2_scales=True, axis=-1).dequantize()


def _mx(r: Any, t: np.ndarray, weight: bool) -> np.ndarray:
    return p.mx_quantize(t, r.format_for("forward"), block_size=r.block_size,
                         pad=True).dequantize()


def _nvfp4(r: Any, t: np.ndarray, weight: bool) -> np.ndarray:
    tiles = (16, 16) if weight and r.two_d_weights else None
    return p.nvfp4_quantize(t, block_shape=tiles).dequantize()


def _blockwise(r: Any, t: np.ndarray, weight: bool) -> np.ndarray:
    k = r.block_size
    return p.blockwise_quantize(t, r.format_for("forward"),
                                block_shape=(k, k) if weight else (1, k)).dequantize()


_REFERENCES: dict[type, _Operand] = {
    nt.Bf16Recipe: _bf16, nt.Fp8CurrentRecipe: _current, nt.Fp8RowwiseRecipe: _rowwise,
    nt.MXRecipe: _mx,
    nt.NVFP4Recipe: _nvfp4, nt.BlockwiseFp8Recipe: _blockwise}
"""The check's oracle: each recipe's forward operands by its public NumPy function, written
apart from the quantizers the layer runs (delayed scaling: `_delayed`)."""


def reference_operands(recipe: Any, x: np.ndarray, w: np.ndarray
                       ) -> list[tuple[np.ndarray, np.ndarray]]:
    """The forward GEMM's dequantised operands by the NumPy recipe functions.

    Parameters
    ----------
    recipe : object
        A `normlab.torch` training recipe.
    x : numpy.ndarray
        Input, shape (M, K), float32.
    w : numpy.ndarray
        Weight, shape (N, K), float32.

    Returns
    -------
    operands : list of tuple
        `(q_x, q_w)` for each forward the check runs (two for delayed scaling, else one).

    Raises
    ------
    TypeError
        If `recipe` is not a training recipe the check knows.
    """
    if nt.recipes.check_recipe(recipe).delayed:
        return _delayed(recipe, x, w)  # type: ignore[return-value]
    ops = _REFERENCES.get(type(recipe))
    if ops is None:
        raise TypeError(f"the training check has no reference for {recipe!r}")
    return [(ops(recipe, x, False), ops(recipe, w, True))]


def forward_error(y: torch.Tensor, qx: np.ndarray, qw: np.ndarray, b: np.ndarray
                  ) -> tuple[float, bool]:
    r"""Error of a layer output against the reference operands (see the module docstring).

    Parameters
    ----------
    y : torch.Tensor
        The layer's output, shape (M, N), float32.
    qx : numpy.ndarray
        Reference input operand, shape (M, K).
    qw : numpy.ndarray
        Reference weight operand, shape (N, K).
    b : numpy.ndarray
        Bias, shape (N,).

    Returns
    -------
    units : float
        $\max |y - \hat y|$ in units of the float32 bound (<= 1 passes).
    bit_identical : bool
        Whether `y` equals the float32 matmul of the reference operands plus `b`.
    """
    got = y.detach().to(torch.float32).numpy().astype(np.float64)  # M,N
    x64, w64, b64 = (a.astype(np.float64) for a in (qx, qw, b))
    exact = x64 @ w64.T + b64  # M,N
    bound = (qx.shape[1] + 1) * _EPS32 * (np.abs(x64) @ np.abs(w64).T + np.abs(b64))
    with np.errstate(divide="ignore", invalid="ignore"):
        units = np.where(got == exact, 0.0, np.abs(got - exact) / bound)
    units = np.where(np.isnan(units), np.inf, units)
    f32 = torch.from_numpy(qx) @ torch.from_numpy(qw).t() + torch.from_numpy(b)
    same = bool(torch.equal(y.detach().to(torch.float32), f32))
    return float(units.max()), same


def _result(errors: list[tuple[float, bool]]) -> dict[str, Any]:
    worst = max(e for e, _ in errors)
    return {"max_error": worst, "bit_identical": all(s for _, s in errors),
            "passed": worst <= 1.0}


def recipe_check(recipe: Any, seed: int = 0) -> dict[str, Any]:
    """`QuantLinear`'s forward against the NumPy recipe functions' fake-quantised matmul.

    Parameters
    ----------
    recipe : object
        A `normlab.torch` training recipe.
    seed : int, optional
        Seed of the data. Default 0.

    Returns
    -------
    result : dict
        `max_error` (units of the float32 bound), `bit_identical`, `passed`.
    """
    x, w, b, layer = _loaded(lambda k, n: nt.QuantLinear(k, n, recipe=recipe), seed)
    with torch.no_grad():
        layer.train()
        errors = [forward_error(layer(torch.from_numpy(x)), qx, qw, b)
                  for qx, qw in reference_operands(recipe, x, w)]
    return _result(errors)


def checkpoint_check(recipe: Any, steps: int = 3, seed: int = 0) -> dict[str, Any]:
    """The converted `QUICK` model trained with and without activation checkpointing.

    Parameters
    ----------
    recipe
        As in [recipe_check][normlab.bench.training_checks.recipe_check].
    steps : int, optional
        Training steps of each. Default 3.
    seed : int, optional
        Seed of the initial weights. Default 0.

    Returns
    -------
    result : dict
        `max_error` (the largest absolute difference of a loss or a final parameter),
        `bit_identical` and `passed` (both: every loss and parameter equal).
    """
    from normlab.bench import training_model as tm  # it imports this module's users only

    base = tm.build_model(tm.QUICK, torch.float32, seed)
    runs = [tm.Run.of(tm.convert(base, recipe), tm.QUICK),
            tm.Run.of(tm.checkpointed(tm.convert(base, recipe)), tm.QUICK)]
    (la, lb), (pa, pb) = ([[r.step() for _ in range(steps)] for r in runs],
                          [list(r.model.parameters()) for r in runs])
    pairs = list(zip(pa, pb, strict=True))
    worst = max([abs(a - b) for a, b in zip(la, lb, strict=True)]
                + [float((a - b).detach().abs().max()) for a, b in pairs])
    same = la == lb and all(torch.equal(a, b) for a, b in pairs)
    return {"max_error": worst, "bit_identical": same, "passed": same}


def _torchao_operand(t: np.ndarray) -> np.ndarray:
    """torchao's tensorwise E4M3 cast, dequantised: `e4m3_sat(t s) / s`."""
    amax = max(float(np.max(np.abs(t.astype(np.float64)))), 1e-12)  # its EPS clamp
    s = np.float32(448.0 / amax)
    q = p.quantize((t * s).astype(np.float32), "e4m3", saturate=True)
    return (q / s).astype(np.float32)


def torchao_check(converter: Callable[[torch.nn.Module], torch.nn.Module],
                  seed: int = 0) -> dict[str, Any]:
    """torchao's converted layer against its definition (see the module docstring).

    Parameters
    ----------
    converter : callable
        `model -> converted copy` (torchao's `convert_to_float8_training`).
    seed
        As in [recipe_check][normlab.bench.training_checks.recipe_check].

    Returns
    -------
    result : dict
        As in [recipe_check][normlab.bench.training_checks.recipe_check].
    """
    x, w, b, linear = _loaded(torch.nn.Linear, seed)
    with torch.no_grad():
        model = converter(torch.nn.Sequential(linear))
        y = model(torch.from_numpy(x))
    return _result([forward_error(y, _torchao_operand(x), _torchao_operand(w), b)])
