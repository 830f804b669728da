"""The inspector's statistics against an independent computation from the public quantisers.

One linear layer with controlled operands: an input x (M, K) with tiny values (that
underflow), a huge column (that saturates blocks' neighbours or the tensor), zeros, NaN and
inf; a weight W (N, K); an output gradient dy (M, N) set by the loss `(y * G).sum()`. For
each recipe, each operand is quantised here with the public functions of `normlab.torch`
(the layout of the converted layer's forward and dgrad GEMMs: blocks along the last axis,
16 x 16 NVFP4 weight tiles, K x K blockwise weight tiles), and the statistics are computed
in NumPy float64 from the issue's definitions, not with the inspector's helpers:

* underflow: nonzero finite x whose quantised value is 0, over the nonzero finite x;
* overflow: finite x whose quantised value is not finite, or whose magnitude over its
  block's dequantisation scale reaches max + half the top binade's spacing of the element
  format (448 + 16 = 464 for E4M3, 6 + 1 = 7 for E2M1: rounding would go past the largest
  value; a block whose scale is 0 clips nothing), over finite x;
* sqnr: 10 log10(sum x^2 / sum (x - q)^2) over elements where x and q are finite.

Tolerances: counts and fractions exactly equal (the same integers divided by the same
integers); amax, scales and ranges exactly (the same float32 values, log2 of them in float64
on both sides); SQNR rtol 1e-9 (float64 sums of up to 2,048 terms in a different order:
relative error below 1e-12).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import normlab.torch as nt
from normlab.precision import get_format

M, K, N = 16, 64, 32


def _operands() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(3)
    x = torch.randn(M, K, generator=g)
    x[:, 5] *= 3e4  # a huge channel
    x[0, :8] = torch.tensor([1e-9, -3e-8, 0.0, 0.0, 2e-12, 1e-7, 1e-10, -1e-9])  # tiny, zeros
    x[1, 3], x[2, 40], x[3, 60] = math.nan, math.inf, -math.inf
    w = torch.randn(N, K, generator=g) * 0.05
    w[4, :16] *= 1e-6  # a tile of tiny weights
    dy = torch.randn(M, N, generator=g) * 1e-3
    dy[:, 7] *= 1e5
    dy[5] *= 1e-7  # a row whose NVFP4 block scales underflow E4M3 (scale 0)
    return x, w, dy


def _expand(scales: np.ndarray, block: tuple[int, int], shape: tuple[int, int]) -> np.ndarray:
    full = np.repeat(np.repeat(scales, block[0], axis=0), block[1], axis=1)
    return full[: shape[0], : shape[1]]


def _public(recipe, role: str, t: torch.Tensor, meta=None):
    """(q, per-element dequantisation scale or None, element format, block) by the public API."""
    fmt = recipe.format_for("backward" if role == "dy" else "forward")
    shape = tuple(t.shape)
    if isinstance(recipe, nt.Bf16Recipe):
        return nt.quantize(t, fmt).numpy(), None, fmt, None, None
    if isinstance(recipe, nt.Fp8CurrentRecipe):
        q = nt.quantize_current_scaling(t, fmt)
        s = np.full(shape, float(q.scale_inv))
        return q.dequantize().numpy(), s, fmt, None, np.array([float(q.scale_inv)])
    if isinstance(recipe, nt.Fp8DelayedRecipe):
        q = meta.quantize(t)
        s = np.full(shape, float(q.scale_inv))
        return q.dequantize().numpy(), s, fmt, None, np.array([float(q.scale_inv)])
    if isinstance(recipe, nt.MXRecipe):
        q = nt.mx_quantize(t, fmt, block_size=32, axis=1, pad=True)
        sc = q.scales.numpy().astype(np.float64)
        return q.dequantize().numpy(), _expand(sc, (1, 32), shape), fmt, (1, 32), sc
    if isinstance(recipe, nt.NVFP4Recipe):
        block = (16, 16) if role == "w" else (1, 16)
        q = nt.nvfp4_quantize(t, axis=1, block_shape=block if role == "w" else None)
        sc = (q.block_scales * q.tensor_scale).numpy().astype(np.float64)
        return q.dequantize().numpy(), _expand(sc, block, shape), fmt, block, sc
    block = (16, 16) if role == "w" else (1, 16)
    q = nt.blockwise_quantize(t, fmt, block_shape=block)
    sc = q.scale_inv.numpy().astype(np.float64)
    return q.dequantize().numpy(), _expand(sc, block, shape), fmt, block, sc


def _range(a: np.ndarray) -> float | None:
    nz = a[a > 0]
    return None if nz.size == 0 else float(np.log2(nz.max()) - np.log2(nz.min()))


def _expected(recipe, role: str, t: torch.Tensor, meta=None) -> dict:
    q, s, fmt, block, scales = _public(recipe, role, t, meta)
    x = t.numpy().astype(np.float64)
    q = q.astype(np.float64)
    finite = np.isfinite(x)
    nz = finite & (x != 0)
    with np.errstate(invalid="ignore", over="ignore"):
        top = float(np.ldexp(1.0, int(np.floor(np.log2(fmt.max))) - fmt.mantissa_bits))
        bound = (fmt.max + top / 2) * (s if s is not None else 1.0)
        clipped = (np.abs(x) >= bound) & (bound > 0)  # a zero scale makes values underflow
        over = finite & (~np.isfinite(q) | clipped)
    both = finite & np.isfinite(q)
    sig = float((x[both] ** 2).sum())
    err = float(((x[both] - q[both]) ** 2).sum())
    a = np.where(finite, np.abs(x), 0.0)
    out = {
        "underflow": (nz & (q == 0)).sum() / nz.sum(),
        "overflow": over.sum() / finite.sum(),
        "sqnr_db": math.inf if err == 0 else 10 * math.log10(sig / err),
        "amax": float(a.max()),
        "dynamic_range": _range(a),
        "nonfinite": (~finite).sum() / x.size,
        "scale_min": None if scales is None else float(np.nanmin(scales)),
        "scale_max": None if scales is None else float(np.nanmax(scales)),
        "worst_block_range": None,
    }
    if block is not None:
        rows = -(-x.shape[0] // block[0]) * block[0]
        cols = -(-x.shape[1] // block[1]) * block[1]
        padded = np.zeros((rows, cols))
        padded[: x.shape[0], : x.shape[1]] = a
        ranges = [_range(padded[i:i + block[0], j:j + block[1]])
                  for i in range(0, rows, block[0]) for j in range(0, cols, block[1])]
        out["worst_block_range"] = max(r for r in ranges if r is not None)
    return out


def _check(got: dict, want: dict) -> None:
    for key in ("underflow", "overflow", "amax", "nonfinite", "scale_min", "scale_max",
                "dynamic_range", "worst_block_range"):
        assert got[key] == want[key], (key, got[key], want[key])
    if math.isinf(want["sqnr_db"]):
        assert got["sqnr_db"] == want["sqnr_db"]
    else:
        assert got["sqnr_db"] == pytest.approx(want["sqnr_db"], rel=1e-9)


def _run(recipe, steps: int = 1) -> list[dict]:
    x, w, dy = _operands()
    layer = torch.nn.Linear(K, N, bias=False)
    with torch.no_grad():
        layer.weight.copy_(w)
    net = torch.nn.Sequential(layer)
    with nt.inspect(net, recipe) as log:
        for _ in range(steps):
            (net(x) * dy).sum().backward()
            log.step()
    return log.records


RECIPES = [nt.Bf16Recipe(), nt.Fp8CurrentRecipe(), nt.MXRecipe(),
           nt.NVFP4Recipe(), nt.BlockwiseFp8Recipe(block_size=16)]


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda r: type(r).__name__)
def test_statistics_equal_an_independent_computation(recipe):
    x, w, dy = _operands()
    records = {r["tensor"]: r for r in _run(recipe)}
    assert set(records) == {"input", "weight", "grad_output"}
    for tensor, role, t in (("input", "x", x), ("weight", "w", w), ("grad_output", "dy", dy)):
        _check(records[tensor], _expected(recipe, role, t))
        assert records[tensor]["numel"] == t.numel()


def test_planted_inputs_hit_every_statistic():
    """The operands are not benign: each statistic the test compares is nonzero somewhere."""
    recs = _run(nt.Fp8CurrentRecipe())
    x_rec = next(r for r in recs if r["tensor"] == "input")
    assert x_rec["underflow"] > 0 and x_rec["nonfinite"] == 3 / (M * K)
    mx = next(r for r in _run(nt.MXRecipe()) if r["tensor"] == "input")
    assert mx["overflow"] > 0  # the inf and NaN make their blocks non-finite
    assert mx["worst_block_range"] > 30
    fp4 = next(r for r in _run(nt.NVFP4Recipe()) if r["tensor"] == "grad_output")
    assert fp4["scale_min"] == 0.0 and fp4["underflow"] >= 0.5 * N / (M * N)


def test_delayed_scaling_keeps_its_own_history():
    recipe = nt.Fp8DelayedRecipe(amax_history_len=4)
    x, w, dy = _operands()
    records = _run(recipe, steps=2)
    metas = {role: nt.Fp8Meta(recipe, "backward" if role == "dy" else "forward")
             for role in ("x", "w", "dy")}
    for step in (0, 1):
        got = {r["tensor"]: r for r in records if r["step"] == step}
        for tensor, role, t in (("input", "x", x), ("weight", "w", w),
                                ("grad_output", "dy", dy)):
            _check(got[tensor], _expected(recipe, role, t, metas[role]))
        for meta in metas.values():
            meta.update()
    assert {r["scale_min"] for r in records if r["step"] == 0} == {1.0}
    # the finite operands' scales moved after step 0 (x holds inf: its scale stays 1)
    assert all(r["scale_min"] != 1.0 for r in records
               if r["step"] == 1 and r["tensor"] != "input")


def test_converted_mode_uses_the_layers_own_recipe():
    x, w, dy = _operands()
    layer = torch.nn.Linear(K, N, bias=False)
    with torch.no_grad():
        layer.weight.copy_(w)
    net = nt.convert(torch.nn.Sequential(layer, torch.nn.Identity()), nt.MXRecipe())
    with nt.inspect(net, None) as log:
        (net(torch.nan_to_num(x, posinf=0.0, neginf=0.0)) * dy).sum().backward()
        log.step()
    got = {r["tensor"]: r for r in log.records}
    assert {r["recipe"] for r in log.records} == {repr(nt.MXRecipe())}
    _check(got["weight"], _expected(nt.MXRecipe(), "w", w))
    _check(got["grad_output"], _expected(nt.MXRecipe(), "dy", dy))


def test_format_names_the_element_format():
    recs = _run(nt.Fp8CurrentRecipe())
    assert {r["tensor"]: r["format"] for r in recs} == {
        "input": get_format("e4m3").name, "weight": get_format("e4m3").name,
        "grad_output": get_format("e5m2").name}


def test_converted_mode_reads_a_delayed_layers_own_scales():
    """A converted delayed-scaling layer that trained one step before the inspector came:
    the inspected step's operands are quantised with the scales the layer holds (from that
    earlier step), not with fresh ones (a new history would start at scale 1); expected
    values from the public fp8_quantize with the layer's scale."""
    g = torch.Generator().manual_seed(5)
    net = nt.convert(torch.nn.Sequential(torch.nn.Linear(K, N), torch.nn.Identity()),
                     nt.Fp8DelayedRecipe(amax_history_len=4))
    layer = net[0]
    net(torch.randn(M, K, generator=g) * 30).sum().backward()  # before inspecting
    x = torch.randn(M, K, generator=g) * 3
    with nt.inspect(net, None) as log:
        net(x).sum().backward()
        log.step()
    got = {r["tensor"]: r for r in log.records}
    fmt = layer.recipe.format_for("forward")
    for tensor, index, t in (("input", 0, x), ("weight", 1, layer.weight.detach())):
        q = nt.fp8_quantize(t, fmt, layer.scale[index])
        assert got[tensor]["scale_min"] == float(q.scale_inv) != 1.0
        x64, q64 = t.numpy().astype(np.float64), q.dequantize().numpy().astype(np.float64)
        want = 10 * math.log10((x64**2).sum() / ((x64 - q64) ** 2).sum())
        assert got[tensor]["sqnr_db"] == pytest.approx(want, rel=1e-9)
