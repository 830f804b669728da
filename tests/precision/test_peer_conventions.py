"""The Conventions rows where peers disagree with normlab, detected at run time.

Peers fix their quirks between releases (ml_dtypes 0.7 stopped double-rounding float64 and
sending E8M0 float32 subnormals up), so each test finds out what the installed peer does,
asserts that it is one of the two known behaviours (the quirk, or normlab's answer), and
asserts normlab's own answer, which is the same either way. Every comparison is exact.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab.precision import BFLOAT16, FLOAT8_E8M0FNU, quantize

# 1 + 2^-8 + 2^-40: above the bf16 midpoint 1 + 2^-8 by less than float32's ulp, so through
# float32 it becomes the exact tie, which goes to the even 1.0; rounded once it is 1 + 2^-7
X64 = 1.0 + 2.0**-8 + 2.0**-40
ONCE, TWICE = 1.0 + 2.0**-7, 1.0
# 1.25 * 2^-127 (float32 bits 0x00500000): the nearest power of two is 2^-127
SUB = 1.25 * 2.0**-127
ROUNDED, SENT_UP = 2.0**-127, 2.0**-126


def test_normlab_rounds_float64_once_and_e8m0_by_value():
    assert quantize(np.array([X64]), BFLOAT16).tolist() == [ONCE]
    for dtype in (np.float32, np.float64):
        assert quantize(np.array([SUB], dtype), FLOAT8_E8M0FNU).tolist() == [ROUNDED]


def test_ml_dtypes_float64_is_one_of_the_known_behaviours():
    peer = float(np.array([X64]).astype(ml_dtypes.bfloat16).astype(np.float64)[0])
    assert peer in (ONCE, TWICE)  # >= 0.7: once, as normlab; < 0.7: via float32


def test_ml_dtypes_e8m0_subnormal_is_one_of_the_known_behaviours():
    x = np.array([SUB], np.float32)
    peer = float(x.astype(ml_dtypes.float8_e8m0fnu).astype(np.float64)[0])
    assert peer in (ROUNDED, SENT_UP)  # >= 0.7: by value, as normlab; < 0.7: up to 2^-126


def test_torch_casts_are_one_of_the_known_behaviours():
    torch = pytest.importorskip("torch")
    peer = torch.tensor([X64], dtype=torch.float64).to(torch.bfloat16).double().item()
    assert peer in (ONCE, TWICE)  # torch 2.13 converts float64 via float32: TWICE
    if not hasattr(torch, "float8_e8m0fnu"):
        return
    for dtype in (torch.float32, torch.float64):
        got = torch.tensor([SUB], dtype=dtype).to(torch.float8_e8m0fnu).double().item()
        assert got in (ROUNDED, SENT_UP), dtype  # torch 2.13: SENT_UP from both
