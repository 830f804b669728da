"""normlab.torch.quantize is bit-identical to normlab.precision.quantize, every format/mode.

Oracle: the NumPy implementation (itself tested against ml_dtypes, PyTorch casts and a
scalar reference). Inputs hit every float32 exponent and top-mantissa pattern, ties at
every cut position, and the specials; comparisons are on the bits (NaN sign included).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import normlab.torch as nt
from normlab.precision import (
    NAMED_FORMATS,
    Format,
    NanConvention,
    RoundingMode,
    get_format,
    quantize,
)

MODES = [m.value for m in RoundingMode]
EXTRA_FORMATS = [
    get_format("e3m4"), get_format("e5m2fnu"), get_format("e2m0fn"),
    Format("wide_bias", 8, 3, bias=130),  # emin = -129 < float32's -126
    Format("ftz_e4m3", 4, 3, has_subnormals=False),
]


def _bits(a: np.ndarray) -> np.ndarray:
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


def _compare(x: np.ndarray, fmt: Format, mode: str, saturate: bool, w: np.ndarray) -> None:
    kw_np = {"random_bits": w} if mode == "stochastic" else {}
    kw_t = {"random_bits": torch.from_numpy(w.view(np.int64))} if mode == "stochastic" else {}
    with np.errstate(over="ignore", invalid="ignore"):
        want = quantize(x, fmt, rounding=mode, saturate=saturate, **kw_np)
    got = nt.quantize(torch.from_numpy(x), fmt, rounding=mode, saturate=saturate, **kw_t)
    assert got.dtype == torch.from_numpy(x).dtype
    diff = np.nonzero(_bits(want) != _bits(got.numpy()))[0]
    assert diff.size == 0, (fmt.name, mode, saturate, x[diff[:4]], want[diff[:4]],
                            got.numpy()[diff[:4]])


@pytest.mark.parametrize("fmt", NAMED_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_named_formats_every_mode(patterns, fmt, dtype):
    x, w = patterns[dtype]
    for mode in MODES:
        _compare(x, fmt, mode, False, w)
    # saturate only changes the overflow/infinity rules: one mode per overflow behaviour
    # (nearest: to inf/NaN; toward_positive: per sign; stochastic: from the words)
    for mode in ("nearest", "toward_positive", "stochastic"):
        _compare(x, fmt, mode, True, w)


@pytest.mark.parametrize("fmt", EXTRA_FORMATS, ids=lambda f: f.name)
def test_unusual_formats(patterns, fmt):
    for dtype in ("float32", "float64"):
        x, w = patterns[dtype]
        for mode in MODES:
            _compare(x, fmt, mode, False, w)
    assert any(f.nan is NanConvention.FN and not f.signed for f in EXTRA_FORMATS)


def test_nan_keeps_sign_and_is_quiet():
    x = torch.tensor([float("nan"), -float("nan")])
    got = nt.quantize(x, "e4m3").view(torch.int32).tolist()
    assert [v % 2**32 for v in got] == [0x7FC00000, 0xFFC00000]  # IEEE quiet NaN, signed


def test_hand_values():
    # e4m3: 1 + 2^-4 is a tie between 1 and 1.125 -> even (1); 464 is the tie between 448
    # and the NaN slot 480 -> even (448); 465 overflows to NaN
    x = torch.tensor([1.0 + 2**-4, 1.0 + 3 * 2**-4, 448.0, 465.0, -0.0, 2**-10])
    got = nt.quantize(x, "e4m3").tolist()
    assert got[:3] == [1.0, 1.25, 448.0] and np.isnan(got[3])
    assert str(got[4]) == "-0.0" and got[5] == 0.0  # 2^-10 is half the smallest subnormal
    assert nt.quantize(x, "e4m3", saturate=True)[3].item() == 448.0
    assert nt.quantize(x, "e4m3", rounding="nearest_away")[0].item() == 1.125
