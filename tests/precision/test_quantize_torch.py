"""A third oracle: PyTorch's float32 -> bfloat16 / float16 / float8_e5m2 casts (nearest)."""

from __future__ import annotations

import numpy as np
import pytest

from normlab.precision import BFLOAT16, FLOAT8_E5M2, FLOAT16, quantize

torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    ("fmt", "tname"),
    [(BFLOAT16, "bfloat16"), (FLOAT16, "float16"), (FLOAT8_E5M2, "float8_e5m2")],
)
def test_nearest_matches_torch(fmt, tname):
    rng = np.random.default_rng(4)
    x = (rng.standard_normal(2**16) * np.exp2(rng.uniform(-30, 18, 2**16))).astype(np.float32)
    x = x[np.abs(x) <= fmt.max]  # torch's fp8 overflow convention differs; stay in range
    tt = getattr(torch, tname)
    want = torch.from_numpy(x).to(tt).to(torch.float32).numpy()
    # exact: all three round to nearest, ties to even, from the float32 bits
    assert np.array_equal(quantize(x, fmt), want)
