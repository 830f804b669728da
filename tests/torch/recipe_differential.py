"""The recipe differential harness: NumPy function, torch function, QuantLinear operand, oracle.

For a recipe and an input kind, `operand_mismatches` builds a real `QuantLinear` and
collects the six operands its three GEMMs multiply (x, W in forward; dy, W in dgrad; dy,
x in wgrad, each blocked along that GEMM's contraction; wgrad's x decoded from the codes
the forward saved), computes the same six with the public NumPy functions of
`normlab.precision`, the public torch functions of `normlab.torch` and the independent
oracles of `recipe_oracles`, and returns every bitwise difference (float32 bit patterns,
NaN included: tolerance 0). The layer runs twice, through the CPU fast path (numba
operand kernels, "quantlinear") and through the recipes' shared arithmetic in torch ops
("quantlinear_torch"), as a float32 or a bfloat16 model. For delayed scaling,
`delayed_mismatches` runs an amax trace through three NumPy `Fp8Meta`, three torch
`Fp8Meta`, the layer and the oracle, and compares operands, scales and histories after
every step. An empty list means the four agree; the planted-bug tests expect a non-empty
one.
"""

from __future__ import annotations

import math

import ml_dtypes
import numpy as np
import recipe_oracles as oracle
import torch

import normlab.torch as nt
from normlab import _backend
from normlab.precision import (
    Bf16Recipe,
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    Fp8Meta,
    Fp8RowwiseRecipe,
    MXRecipe,
    NVFP4Recipe,
    blockwise_quantize,
    mx_dequantize,
    mx_quantize,
    nvfp4_quantize,
    quantize,
    quantize_current_scaling,
)
from normlab.torch import QuantLinear
from normlab.torch.training._gemm import backward_operands, forward_operands, stream_seed
from recipe_table import VARIANTS, operand_recipes

M, K, N = 40, 72, 56  # ragged for blocks of 16, 32 and 128
SLOTS = (("fwd_x", "x", 1), ("fwd_w", "w", 1), ("dgrad_dy", "dy", 1), ("dgrad_w", "w", 0),
         ("wgrad_dy", "dy", 0), ("wgrad_x", "x", 0))

RECIPES = operand_recipes(VARIANTS)
"""Every recipe setting of the table but delayed scaling (`delayed_mismatches`)."""

INPUTS = ("spread", "nan_block", "inf_block", "ties", "subnormal", "all_tiny", "near_max")

_E4M3_MIDS = [1.0625, 17.0, 0.0029296875, 3.25, 0.8125, 208.0, 0.015625 * 1.125]
_E2M1_MIDS = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]


def make_input(kind: str, shape: tuple[int, int], seed: int) -> np.ndarray:
    """A float32 array of `shape` of one input kind (see INPUTS)."""
    rng = np.random.default_rng(seed)
    r, c = shape
    x = rng.standard_normal(shape) * np.exp2(rng.uniform(-8, 8, (r, 1)))
    x[2, :] = 0.0  # zero blocks along every tiling
    x[:, 3] = 0.0
    x[17:33, 16:32] = 0.0  # a whole 16 x 16 tile
    if kind == "nan_block":
        x[5, 7] = np.nan
        x[20, 40] = np.nan
    elif kind == "inf_block":
        x[9, 20], x[30, 50 % c] = np.inf, -np.inf
    elif kind == "ties":  # midpoints that survive power-of-two scales
        x[0, 0] = 448.0  # per-tensor: scale 1 (E4M3), 128 (E5M2)
        x[1, :] = np.resize(_E4M3_MIDS, c)
        x[1, 0] = 448.0  # MX E4M3 block amax 448: scale 1
        x[4, 0] = 2688.0  # NVFP4: S_enc = 1
        for b, k in zip(range(0, c, 16), range(8), strict=False):  # block amax 6 * 2^k
            x[6, b:b + 16] = np.resize(_E2M1_MIDS, min(16, c - b)) * 2.0**k
            x[6, b] = 6.0 * 2.0**k
    elif kind == "subnormal":
        x[10:20, :] *= 2.0**-135  # float32 subnormals and tiny normals
        x[12, :5] = [1e-45, -1e-45, 2e-39, 1e-40, 0.0]
    elif kind == "all_tiny":
        x = x * 2.0**-140  # the tensor amax itself is subnormal
    elif kind == "near_max":
        x[7:9, :] = np.sign(x[7:9, :]) * 3.0e38
        x[8, 5] = np.float32(np.finfo(np.float32).max)
    return x.astype(np.float32)


def _bits(a) -> np.ndarray:
    arr = a.detach().cpu().numpy() if isinstance(a, torch.Tensor) else np.asarray(a)
    return np.ascontiguousarray(arr, dtype=np.float32).view(np.uint32)


def _diff(name: str, paths: dict[str, object]) -> list[str]:
    """Every path against the oracle (or the first path), bit for bit."""
    ref_name = "oracle" if "oracle" in paths else next(iter(paths))
    ref = _bits(paths[ref_name])
    out = []
    for path, value in paths.items():
        got = _bits(value)
        if got.shape != ref.shape:
            out.append(f"{name}: {path} shape {got.shape} != {ref_name} {ref.shape}")
        elif not np.array_equal(got, ref):
            out.append(f"{name}: {path} != {ref_name} at {int((got != ref).sum())} elements")
    return out


def _layer(recipe: object, w: np.ndarray, dtype: torch.dtype = torch.float32) -> QuantLinear:
    layer = QuantLinear(w.shape[1], w.shape[0], recipe=recipe, dtype=dtype)
    with torch.no_grad():
        layer.weight.copy_(_tensor(w, dtype))  # a copy within one dtype keeps the bits
    return layer.train()


def _tensor(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """`a` as a tensor of `dtype`; bfloat16 from ml_dtypes' bits (`a` holds bfloat16 values
    already; torch's own cast turns NaN into a negative NaN)."""
    if dtype == torch.bfloat16:
        bits = np.ascontiguousarray(a, np.float32).astype(ml_dtypes.bfloat16).view(np.int16)
        return torch.from_numpy(bits).view(torch.bfloat16)
    return torch.from_numpy(np.ascontiguousarray(a, np.float32)).to(dtype)


def layer_operands(layer: QuantLinear, x, w, dy) -> dict[str, torch.Tensor]:
    """The six operands QuantLinear's GEMMs multiply (one forward and one backward), the
    operands in the layer's dtype, on its device; wgrad_x is decoded from what the forward
    saved."""
    dtype, device = layer.weight.dtype, layer.weight.device
    xt, wt, dyt = (_tensor(a, dtype).to(device) for a in (x, w, dy))
    qx, qw, saved, w_scale = forward_operands(layer, xt, wt)
    dy_n, w_n, dy_m, x_m = backward_operands(layer, dyt, wt, saved, w_scale)
    return {"fwd_x": qx, "fwd_w": qw, "dgrad_dy": dy_n, "dgrad_w": w_n, "wgrad_dy": dy_m,
            "wgrad_x": x_m}


def _bf16_values(a: np.ndarray) -> np.ndarray:
    """float32 `a` rounded to bfloat16 (to nearest even) and widened back: a bf16 model's
    values (NaN and inf stay)."""
    return a.astype(ml_dtypes.bfloat16).astype(np.float32)


def _rht(a: np.ndarray, seed: int) -> np.ndarray:
    """Rows zero-padded to a multiple of 16, then the torch RHT along M (the layer's)."""
    t = torch.nn.functional.pad(torch.from_numpy(a), (0, 0, 0, (-a.shape[0]) % 16))
    return nt.random_hadamard_transform(t, 16, seed=seed, axis=0).numpy()


def _per_slot(recipe, a: np.ndarray, role: str, axis: int, seed: int | None):
    """{"numpy"|"torch"|"oracle": (dequantised, elements)} for one slot; elements are the
    stored values before the scale (the rounded data; for bf16 the operand itself)."""
    fmt = recipe.format_for("backward" if role == "dy" else "forward")
    t = torch.from_numpy(a)
    if isinstance(recipe, Bf16Recipe):
        q, qt = quantize(a, fmt), nt.quantize(t, fmt)
        return {"numpy": (q, q), "torch": (qt, qt), "oracle": (quantize(a, fmt),) * 2}
    if isinstance(recipe, Fp8CurrentRecipe):
        kw = {"margin": recipe.margin, "amax_epsilon": recipe.amax_epsilon,
              "power_of_2_scales": recipe.power_of_2_scales}
        qn, qt = quantize_current_scaling(a, fmt, **kw), nt.quantize_current_scaling(t, fmt, **kw)
        return {"numpy": (qn.dequantize(), qn.data), "torch": (qt.dequantize(), qt.data),
                "oracle": oracle.current(a, fmt, margin=recipe.margin, eps=recipe.amax_epsilon,
                                         pow2=recipe.power_of_2_scales)}
    if isinstance(recipe, MXRecipe):
        kw = {"block_size": recipe.block_size, "axis": axis, "scale_rule": recipe.scale_rule,
              "pad": True}
        qn, qt = mx_quantize(a, fmt, **kw), nt.mx_quantize(t, fmt, **kw)
        return {"numpy": (mx_dequantize(qn), qn.elements), "torch": (qt.dequantize(), qt.elements),
                "oracle": oracle.mx(a, fmt, axis, recipe.block_size, recipe.scale_rule)}
    if isinstance(recipe, NVFP4Recipe):
        two_d = role == "w" and recipe.two_d_weights
        kw = ({"block_shape": (16, 16)} if two_d else {"axis": axis})
        if seed is not None:
            kw.update(rounding="stochastic", seed=seed)
        qn, qt = nvfp4_quantize(a, **kw), nt.nvfp4_quantize(t, **kw)
        return {"numpy": (qn.dequantize(), qn.elements), "torch": (qt.dequantize(), qt.elements),
                "oracle": oracle.nvfp4(a, axis=axis, two_d=two_d, seed=seed)}
    if isinstance(recipe, Fp8RowwiseRecipe):
        return _rowwise_slot(recipe, a, t, role, axis)
    assert isinstance(recipe, BlockwiseFp8Recipe)
    k = recipe.block_size
    kw = {"power_of_2_scales": recipe.power_of_2_scales, "amax_epsilon": recipe.amax_epsilon}
    want = oracle.blockwise(a, fmt, (k, k) if role == "w" else (1, k), axis,
                            pow2=recipe.power_of_2_scales, eps=recipe.amax_epsilon)
    if role == "w":
        qn = blockwise_quantize(a, fmt, block_shape=(k, k), **kw)
        qt = nt.blockwise_quantize(t, fmt, block_shape=(k, k), **kw)
        return {"numpy": (qn.dequantize(), qn.data), "torch": (qt.dequantize(), qt.data),
                "oracle": want}
    moved = np.ascontiguousarray(np.moveaxis(a, axis, -1))
    qn = blockwise_quantize(moved, fmt, block_shape=(1, k), **kw)
    qt = nt.blockwise_quantize(torch.from_numpy(moved), fmt, block_shape=(1, k), **kw)
    back_n = [np.moveaxis(v, -1, axis) for v in (qn.dequantize(), qn.data)]
    back_t = [v.movedim(-1, axis) for v in (qt.dequantize(), qt.data)]
    return {"numpy": tuple(back_n), "torch": tuple(back_t), "oracle": want}


def _rowwise_slot(recipe, a: np.ndarray, t, role: str, axis: int):
    """Row-wise FP8: the public current scaling along the contraction axis (its non-finite
    slices then NaN, the recipe's rule: the public function keeps Transformer Engine's scale
    of 1 there), W per tensor in dgrad and x, dy unquantised in wgrad under
    `grad_weight_high_precision`."""
    fmt = recipe.format_for("forward")
    if recipe.grad_weight_high_precision and axis == 0 and role != "w":
        same = (a.astype(np.float32),) * 2
        return {"numpy": same, "torch": (t, t), "oracle": same}
    reduce = None if recipe.grad_weight_high_precision and axis == 0 else axis
    kw = {"amax_epsilon": 1e-12, "power_of_2_scales": True, "axis": reduce}
    qn, qt = quantize_current_scaling(a, fmt, **kw), nt.quantize_current_scaling(t, fmt, **kw)
    bad = ~np.isfinite(a).all(axis=reduce, keepdims=reduce is not None)
    nan = np.float32(np.nan)
    numpy = tuple(np.where(bad, nan, v) for v in (qn.dequantize(), qn.data))
    torch_ = tuple(torch.where(torch.from_numpy(np.broadcast_to(bad, a.shape).copy()),
                               torch.tensor(nan), v) for v in (qt.dequantize(), qt.data))
    return {"numpy": numpy, "torch": torch_, "oracle": oracle.rowwise(a, fmt, reduce)}


def operand_mismatches(recipe_name: str, kind: str, dtype: str = "float32") -> list[str]:
    """Every difference among the paths, over the six operands (empty: they agree).

    QuantLinear runs twice: "quantlinear" as it runs (on the CPU, the numba operand
    kernels), "quantlinear_torch" with `NORMLAB_BACKEND=numpy` semantics (the recipes'
    shared arithmetic in torch ops, the path of other devices). `dtype="bfloat16"` feeds
    the layers a bfloat16 model's operands (the inputs rounded to bfloat16); the NumPy,
    torch and oracle paths see their float32 values.
    """
    recipe = RECIPES[recipe_name]
    x, w, dy = (make_input(kind, shape, seed) for shape, seed in
                (((M, K), 1), ((N, K), 2), ((M, N), 3)))
    torch_dtype = getattr(torch, dtype)
    if dtype == "bfloat16":
        x, w, dy = (_bf16_values(a) for a in (x, w, dy))
    layer = _layer(recipe, w, torch_dtype)
    counter = layer.rounding_step  # the stochastic streams the backward will use
    got = layer_operands(layer, x, w, dy)
    with _backend.use_backend("numpy"):
        generic = layer_operands(_layer(recipe, w, torch_dtype), x, w, dy)
    seeds: dict[str, int | None] = {}
    if isinstance(recipe, NVFP4Recipe) and recipe.stochastic_gradients:
        seeds = {"dgrad_dy": stream_seed(layer.seed, counter, 0),
                 "wgrad_dy": stream_seed(layer.seed, counter, 1)}
    out: list[str] = []
    arrays = {"x": x, "w": w, "dy": dy}
    for slot, role, axis in SLOTS:
        a = arrays[role]
        if isinstance(recipe, NVFP4Recipe) and recipe.hadamard and slot.startswith("wgrad"):
            a = _rht(a, recipe.seed)
        paths = _per_slot(recipe, a, role, axis, seeds.get(slot))
        name = f"{recipe_name}/{kind}/{slot}"
        out += _diff(name, {"oracle": paths["oracle"][0], "numpy": paths["numpy"][0],
                            "torch": paths["torch"][0], "quantlinear": got[slot],
                            "quantlinear_torch": generic[slot]})
        out += _diff(f"{name} elements", {p: v[1] for p, v in paths.items()})
    return out


# --- delayed scaling -------------------------------------------------------------------
TRACES = {
    "steps": [2.0, 8.0, 1.0, 0.5, 0.25, 4.0],
    "zero_nan_inf": [10.0, 0.0, 1.0, math.nan, 3.0, 0.0, math.inf, 2.0, 0.5, 6.0],
    "extremes": [3.0e38, 1e-40, 0.0, 448.0, 1e-45, 2.0],
}


def _step_input(amax: float, seed: int, shape: tuple[int, int]) -> np.ndarray:
    """A float32 array whose max |x| is `amax` (0: zeros; NaN, inf: planted)."""
    base = np.random.default_rng(seed).uniform(-1.0, 1.0, shape)
    base[0, 0] = -1.0  # the max magnitude sits at a negative value
    if amax == 0.0:
        return np.zeros(shape, np.float32)
    if math.isnan(amax) or math.isinf(amax):
        x = (base * 3.0).astype(np.float32)
        x[1, 1] = amax
        return x
    with np.errstate(over="ignore", under="ignore"):
        return (base * amax).astype(np.float32)


def delayed_mismatches(recipe: Fp8DelayedRecipe, trace: list[float]) -> list[str]:
    """Every difference among NumPy Fp8Meta, torch Fp8Meta, QuantLinear and the oracle over
    an amax trace: the operands of each step, then the scales and histories after it."""
    roles = (("x", "forward", (M, K)), ("w", "forward", (N, K)), ("dy", "backward", (M, N)))
    np_metas = [Fp8Meta(recipe, role) for _, role, _ in roles]
    t_metas = [nt.Fp8Meta(recipe, role) for _, role, _ in roles]
    fmts = [recipe.format_for(role) for _, role, _ in roles]
    state = [(np.zeros(recipe.amax_history_len, np.float32), np.float32(1.0)) for _ in roles]
    layer = _layer(recipe, np.zeros((N, K), np.float32))
    out: list[str] = []
    for step, amax in enumerate(trace):
        arrays = [_step_input(amax, 10 * step + i, shape) for i, (_, _, shape) in enumerate(roles)]
        got = layer_operands(layer, *arrays)
        layer_q = [got["fwd_x"], got["fwd_w"], got["dgrad_dy"]]
        for i, (name, _, _) in enumerate(roles):
            h, s = state[i]
            want = oracle.per_tensor(arrays[i], fmts[i], s)
            h = h.copy()
            h[0] = oracle.record(h[0], oracle.amax_of(arrays[i]))
            state[i] = (h, s)
            out += _diff(f"step {step} {name}", {
                "oracle": want, "numpy": np_metas[i].quantize(arrays[i]).dequantize(),
                "torch": t_metas[i].quantize(torch.from_numpy(arrays[i])).dequantize(),
                "quantlinear": layer_q[i]})
        layer.update_scales()  # what the next training forward does first
        for i, (name, _, _) in enumerate(roles):
            np_metas[i].update()
            t_metas[i].update()
            h, s = state[i]
            state[i] = oracle.te_delayed_update(h, s, fmts[i].max, recipe.margin,
                                                recipe.amax_compute_algo, recipe.update)
            out += _diff(f"step {step} {name} scale", {
                "oracle": np.float32(state[i][1]), "numpy": np.float32(np_metas[i].scale),
                "torch": t_metas[i].scale, "quantlinear": layer.scale[i]})
            out += _diff(f"step {step} {name} history", {
                "oracle": state[i][0], "numpy": np_metas[i].amax_history,
                "torch": t_metas[i].amax_history, "quantlinear": layer.amax_history[i]})
    return out


def bf16_blockwise_mismatches(kind: str) -> list[str]:
    """bfloat16 input to blockwise FP8, NumPy (ml_dtypes) against torch and the oracle,
    whose overflow value is bfloat16's max (TE's compute_scale_from_types)."""
    x = make_input(kind, (M, K), 4)
    xb = x.astype(ml_dtypes.bfloat16)
    wide = xb.astype(np.float32)
    bf16_max = np.float32(ml_dtypes.finfo(ml_dtypes.bfloat16).max)
    want, _ = oracle.blockwise(wide, oracle.FLOAT8_E4M3FN, (1, 32), 1, value_for_inf=bf16_max)
    got_np = blockwise_quantize(xb, block_shape=(1, 32)).dequantize()
    same_bits = torch.from_numpy(xb.view(np.int16)).view(torch.bfloat16)  # torch's own cast
    got_t = nt.blockwise_quantize(same_bits, block_shape=(1, 32)).dequantize()  # of NaN differs
    return _diff(f"bf16 blockwise/{kind}", {"oracle": want, "numpy": got_np, "torch": got_t})
