"""The compiled MX and NVFP4 scale rules equal the shared rules of
[normlab.precision.scaled.block_scales][] bit for bit (tolerance 0: float32 bit patterns, codes
exactly), on amax grids that hit every branch of the rules: zeros, float32 subnormals,
values at, just below and just above every power of two, float32's largest values, inf
and NaN."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

pytest.importorskip("numba")

from normlab import _backend
from normlab.kernels import operand as kop
from normlab.kernels import scale_grid_jit
from normlab.precision.operands import operand as po
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled import block_scales
from normlab.precision.scaled.namespace import NUMPY
from normlab.precision.scaled.quantizers import MXQuantizer
from normlab.precision.scaled.recipe_formats import mx_element_format

MX_ELEMENTS = ["e4m3", "e5m2", "fp6_e3m2", "fp6_e2m3", "fp4_e2m1", "int8"]


def _grid() -> np.ndarray:
    """Non-negative float32 amaxes (NaN allowed), shape (n, 8)."""
    powers = np.float32(2.0) ** np.arange(-149, 128, dtype=np.float64).astype(np.float32)
    below = np.nextafter(powers, np.float32(0))
    above = np.nextafter(powers, np.float32(np.inf))
    rng = np.random.default_rng(3)
    spread = np.abs(rng.standard_normal(400) * np.exp2(rng.uniform(-140, 127, 400)))
    special = [0.0, np.inf, np.nan, np.finfo(np.float32).max, 1e-45, 448.0, 6.0, 1.5]
    values = np.concatenate([np.float32(special), powers, below, above,
                             spread.astype(np.float32)]).astype(np.float32)
    values = values[: values.size - values.size % 8]
    return np.ascontiguousarray(values.reshape(-1, 8))


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.float32).view(np.uint32)


@pytest.mark.parametrize("rule", ["ocp", "round_up"])
@pytest.mark.parametrize("elem", MX_ELEMENTS)
def test_mx_grid_equals_the_shared_rule(elem: str, rule: str) -> None:
    fmt = mx_element_format(elem)
    amax = _grid()
    want = block_scales.mx_scale_codes(amax, fmt, rule, xp=NUMPY)
    mul, d1 = np.empty_like(amax), np.empty_like(amax)
    codes = np.empty(amax.shape, np.uint8)
    scale_grid_jit.mx_grid.serial(amax, fmt.emax, rule == "round_up",
                                  np.float32(1.0 / fmt.max), mul, d1, codes)
    np.testing.assert_array_equal(codes, want.astype(np.uint8))
    bad = want == block_scales.MX_NAN_CODE
    np.testing.assert_array_equal(_bits(d1), _bits(core.e8m0_values(want, xp=NUMPY)))
    factor = np.ldexp(np.float64(1.0), np.where(bad, 0, 127 - want)).astype(np.float32)
    np.testing.assert_array_equal(_bits(mul), _bits(factor))  # 2^-code, exact
    assert (want == 0).any() and bad.any()  # the grid reaches both ends


@pytest.mark.parametrize("tensor_amax", [1.0, 0.0, np.inf, np.nan, 3.0e38, 1e-40])
def test_nvfp4_grid_equals_the_shared_rule(tensor_amax: float) -> None:
    amax = _grid()
    t = np.float32(tensor_amax)
    s_b, e_b, s_dec = block_scales.nvfp4_scales(amax, t, xp=NUMPY)
    s_mul, dec = block_scales.nvfp4_tensor_factors(t, xp=NUMPY)
    assert np.float32(dec).view(np.uint32) == np.float32(s_dec).view(np.uint32)
    got_e, got_s = np.empty_like(amax), np.empty_like(amax)
    scale_grid_jit.nvfp4_grid.serial(
        amax, np.float32(s_mul), np.float32(dec), *kop._E4M3_SAT,
        np.float32(np.finfo(np.float32).max), got_e, got_s)
    np.testing.assert_array_equal(_bits(got_s), _bits(s_b))
    np.testing.assert_array_equal(_bits(got_e), _bits(e_b))


def test_the_operand_kernel_uses_the_compiled_rules(monkeypatch) -> None:
    # the operand kernel's MX scales come from `mx_grid`: equal to the reference as it is,
    # different once a fault is planted there
    x = np.random.default_rng(0).standard_normal((8, 64)).astype(np.float32)
    spec = MXQuantizer(mx_element_format("e4m3"), 1, 32)
    with _backend.use_backend("numpy"):
        want = po.encode_operand(x, spec, order="C")
    np.testing.assert_array_equal(kop.encode_operand(x, spec, None, "C").scales, want.scales)
    real = scale_grid_jit.mx_grid

    def off(amax, emax, round_up, inv_max, mul, d1, codes):
        real.serial(amax, emax, round_up, inv_max, mul, d1, codes)
        codes[0, 0] += 1

    monkeypatch.setattr(scale_grid_jit, "mx_grid", SimpleNamespace(serial=off, parallel=off))
    assert not np.array_equal(kop.encode_operand(x, spec, None, "C").scales, want.scales)
