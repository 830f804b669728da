"""The operand kernels equal the reference operand functions, bit for bit.

`normlab.kernels.operand` serves [fake_operand][normlab.precision.operands.operand.fake_operand],
[encode_operand][normlab.precision.operands.operand.encode_operand], their one-pass pair
[fake_encode_operand][normlab.precision.operands.one_pass.fake_encode_operand] (elementwise and
per-tensor kinds) and
[decode_operand][normlab.precision.operands.operand.decode_operand] on NumPy arrays. Each is
compared with the reference (the recipes' shared arithmetic, `use_backend("numpy")`) at
tolerance 0 (float32 bit patterns, NaN payloads included; codes and scales exactly): every
recipe's operand specs (each role, both contraction axes), float32 and bfloat16 input
(bfloat16 read as its 16-bit patterns), rows-contiguous and columns-contiguous input,
both output layouts, a ragged shape (40 x 72: partial blocks of 16, 32 and 128), wide rows
(40 x 300: the fixed-length block loops of 16, 32 and 128 with their tails), and
values that hit zero blocks, NaN and inf inside blocks, rounding ties, float32
subnormals and float32's largest values. The kernel must serve every case (a silent
fallback to the reference would make the comparison vacuous), and planted faults in the
kernel's scale pass and in its decode loop must be caught.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

numba = pytest.importorskip("numba")

from normlab import _backend  # noqa: E402
from normlab.kernels import operand as kop  # noqa: E402
from normlab.kernels import operand_jit  # noqa: E402
from normlab.precision.formats.format import get_format  # noqa: E402
from normlab.precision.operands import operand as po  # noqa: E402
from normlab.precision.scaled.quantizers import Quantizer  # noqa: E402
from recipe_table import TRAINING, VARIANTS, operand_recipes  # noqa: E402

RECIPES = operand_recipes({**TRAINING, **{k: VARIANTS[k] for k in (
    "mx_fp4_round_up", "mx_int8_fp6_16", "blockwise_16_pow2_eps")}})
SPECS = sorted({(name, role, axis) for name in RECIPES for role in ("x", "w", "dy")
                for axis in (0, 1)})
KINDS = ("spread", "hostile")


def _input(kind: str, dtype: str, layout: str, shape: tuple[int, int] = (40, 72)) -> np.ndarray:
    rng = np.random.default_rng(7)
    x = rng.standard_normal(shape) * np.exp2(rng.uniform(-8, 8, (shape[0], 1)))
    x[2, :] = 0.0
    x[17:33, 16:32] = 0.0  # a whole 16 x 16 tile
    if kind == "hostile":
        x[5, 7], x[20, 40] = np.nan, -np.nan
        x[9, 20], x[30, 50] = np.inf, -np.inf
        x[1, :] = np.resize([0.25, 0.75, 1.25, 2.5, 5.0, 17.0, 3.25, 448.0], shape[1])  # ties
        x[10:14, :] *= 2.0**-135  # float32 subnormals
        x[12, :3] = [1e-45, -1e-45, 0.0]
        x[7, :] = np.sign(x[7, :]) * 3.0e38
        x[8, 5] = np.finfo(np.float32).max
    a = x.astype(np.float32)
    if dtype == "bfloat16":
        a = a.astype(ml_dtypes.bfloat16)
    return np.asfortranarray(a) if layout == "F" else np.ascontiguousarray(a)


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


def _equal(a: object, b: object) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a, b = np.asarray(a), np.asarray(b)
    if a.dtype == np.float32:
        return a.shape == b.shape and np.array_equal(_bits(a), _bits(b))
    return a.dtype == b.dtype and np.array_equal(a, b)


def _spec(name: str, role: str, axis: int) -> Quantizer:
    return RECIPES[name].quantizer(role, axis)


def _mismatches(spec: Quantizer, x: np.ndarray, seed: int | None) -> list[str]:
    """Every difference between the kernels and the reference for one input (the quantizer
    as a layer runs it on `x`'s dtype: an unquantised operand is rounding to that format)."""
    spec = spec.for_input(get_format(x.dtype))
    scale = np.float32(0.75) if spec.takes_scale else None
    out = []
    for order in ("C", "F"):
        got = kop.fake_operand(x, spec, scale, seed, order)
        if spec.fmt.bits > 16:  # beyond the loops' reach (module contract): declined
            return [] if got is NotImplemented else [f"{order}: a 32-bit format served"]
        if got is NotImplemented:
            return [f"{order}: fake_operand not served"]
        with _backend.use_backend("numpy"):
            want = po.fake_operand(x, spec, scale=scale, seed=seed, order=order)
        if not _equal(got, want):
            out.append(f"{order}: fake values differ")
        if (got.flags.f_contiguous if order == "F" else got.flags.c_contiguous) is False:
            out.append(f"{order}: fake layout")
        if seed is not None:
            continue
        enc = kop.encode_operand(x, spec, scale, order)
        if enc is NotImplemented:
            return [f"{order}: encode_operand not served"]
        with _backend.use_backend("numpy"):
            ref = po.encode_operand(x, spec, scale=scale, order=order)
            ref_values = po.decode_operand(ref, spec, x.shape, order=order)
        for part in ("codes", "scales", "tensor_scale"):
            if not _equal(getattr(enc, part), getattr(ref, part)):
                out.append(f"{order}: {part} differ")
        if spec.axis_free and (order == "F") == (not x.flags.c_contiguous):
            both = kop.fake_encode_operand(x, spec, scale, order)  # the one-pass kernel
            if both is NotImplemented:
                return [f"{order}: fake_encode_operand not served"]
            if not _equal(both[0], want):
                out.append(f"{order}: one-pass values differ")
            for part in ("codes", "scales", "tensor_scale"):
                if not _equal(getattr(both[1], part), getattr(ref, part)):
                    out.append(f"{order}: one-pass {part} differ")
        dec = kop.decode_operand(enc, spec, x.shape, order)
        if dec is NotImplemented:
            return [f"{order}: decode_operand not served"]
        for path, v in (("kernel decode", dec), ("reference decode", ref_values)):
            if not _equal(v, want):
                out.append(f"{order}: {path} != fake_operand")
    return out


@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize(("name", "role", "axis"), SPECS)
def test_kernels_equal_the_reference(name, role, axis, kind, dtype, layout) -> None:
    spec = _spec(name, role, axis)
    assert _mismatches(spec, _input(kind, dtype, layout), None) == []


@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize(("name", "role", "axis"), SPECS)
def test_odd_groups_equal_the_reference(name, role, axis, layout) -> None:
    # 75 x 45: three groups of rows per parallel task with an odd last one (5 or 13
    # rows), so transposed writes and NVFP4's packed pairs across rows end on a lone row
    spec = _spec(name, role, axis)
    x = _input("spread", "float32", layout, (75, 45))
    assert _mismatches(spec, x, None) == []


@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("name", ["blockwise_128", "mx", "nvfp4"])
def test_wide_rows_equal_the_reference(name, kind, layout) -> None:
    # 40 x 300: rows of blocks along them run as fixed-length loops of 16, 32 or 128 (two
    # full blocks of 128 and a tail of 44; tails of 12 for 16 and 32); blocks across rows
    # see 300 columns of partial row groups
    spec_of = {"blockwise_128": VARIANTS["blockwise_128"]}
    x = _input(kind, "float32", layout, (40, 300))
    for role in ("x", "w", "dy"):
        for axis in (0, 1):
            recipe = spec_of.get(name)
            spec = (recipe.quantizer(role, axis) if recipe is not None
                    else _spec(name, role, axis))
            seed = 2**40 + 3 if name == "nvfp4" and role == "dy" else None
            assert _mismatches(spec, x, seed) == [], (role, axis)


@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_nvfp4_stochastic_rounding_equals_the_reference(dtype, layout) -> None:
    # NVFP4 gradients: each element takes the word of its index in the logical C order,
    # whatever the layout it is read in
    for axis in (0, 1):
        spec = _spec("nvfp4", "dy", axis)
        assert _mismatches(spec, _input("hostile", dtype, layout), 2**62 + 5) == []


def test_a_strided_view_is_declined() -> None:
    # neither rows nor columns contiguous: the kernel declines, the reference serves
    x = _input("spread", "float32", "C")[:, ::2]
    assert kop.fake_operand(x, _spec("mx", "x", 1), None, None, "C") is NotImplemented


def test_planted_scale_fault_is_caught(monkeypatch) -> None:
    # the kernel's block amax doubled: MX and blockwise scales change, the test fails
    real = kop._amax
    monkeypatch.setattr(kop, "_amax", lambda xb, ra, rb: real(xb, ra, rb) * np.float32(2))
    for name in ("mx", "blockwise", "nvfp4"):
        spec = _spec(name, "x", 1)
        assert _mismatches(spec, _input("spread", "float32", "C"), None)


def _plant_ulp(monkeypatch, kernel, out_index: int, at: float) -> None:
    """After each launch of `kernel`, flip the lowest bit of one float32 of its output
    argument `out_index` (C-contiguous), `at` of the way through it."""
    real = kop.launch

    def off(kern, n, *args):
        done = real(kern, n, *args)
        if kern is kernel:
            flat = args[out_index].reshape(-1).view(np.uint32)
            flat[int(flat.size * at)] ^= np.uint32(1)
        return done

    monkeypatch.setattr(kop, "launch", off)


def test_planted_one_pass_fault_is_caught(monkeypatch) -> None:
    # the one-pass kernel's values off by one ulp somewhere: its values no longer equal
    # fake_operand's, while its codes still do
    _plant_ulp(monkeypatch, operand_jit.fake_encode_flat, -2, 1 / 3)  # vo
    spec = _spec("current", "x", 1)
    assert _mismatches(spec, _input("spread", "float32", "C"), None) == [
        "C: one-pass values differ"]


def test_planted_decode_fault_is_caught(monkeypatch) -> None:
    # the decode loop's output off by one ulp somewhere: saved codes no longer give the
    # operand back
    _plant_ulp(monkeypatch, operand_jit.decode_blocks, -1, 1 / 2)  # vo
    spec = _spec("current", "x", 0)
    assert _mismatches(spec, _input("spread", "float32", "C"), None) == [
        "C: kernel decode != fake_operand", "F: kernel decode != fake_operand"]


def test_serial_block_runs_large_launches_serially(monkeypatch) -> None:
    # torch on one thread asks for serial kernels: no parallel region, whatever the size
    from normlab.kernels import _adapt

    monkeypatch.setitem(_adapt._STATE, "layer_safe", True)  # no real threading layer here
    monkeypatch.setitem(_adapt._STATE, "parallel_ran", _adapt._STATE["parallel_ran"])
    calls = []
    kern = type("K", (), {"serial": lambda *a: calls.append("serial"),
                          "parallel": lambda *a: calls.append("parallel")})()
    with _adapt.serial():
        _adapt.launch(kern, 1 << 30)
    _adapt.launch(kern, 1 << 30)
    assert calls == ["serial", "parallel"]


@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("kind", KINDS)
def test_tensor_amax_kernel_equals_the_reference(kind, dtype, layout) -> None:
    # served (not declined) and equal to the reference; NaN inputs give NaN
    from normlab.precision.scaled import arithmetic as core
    from normlab.precision.scaled.namespace import NUMPY

    x = _input(kind, dtype, layout)
    got = kop.tensor_amax(x)
    assert got is not NotImplemented
    with _backend.use_backend("numpy"):
        want = core.tensor_amax(x, xp=NUMPY)
    assert np.float32(got).dtype == np.float32 and np.asarray(want).dtype == np.float32
    assert (np.isnan(got) and np.isnan(want)) or float(got) == float(want)
