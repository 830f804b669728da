"""`Quantizer.identity_on`: which quantizers keep an operand held in a format as it is.

The bfloat16 GEMM path skips the quantisation of an operand whose quantizer says so, so the
claim is checked against the quantisation itself: every non-NaN bfloat16 value (all 2^16
bit patterns) and float16 value comes back unchanged from rounding to its own format, and
a quantizer that scales, saturates or rounds to another format never claims it.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from normlab.precision import get_format, quantize
from normlab.precision.scaled.quantizers import (
    Fp8BlockQuantizer,
    Fp8TensorQuantizer,
    IdentityQuantizer,
    MXQuantizer,
    NVFP4Quantizer,
    RoundQuantizer,
)

BF16, FP16, FP32 = get_format("bfloat16"), get_format("float16"), get_format("float32")
E4M3 = get_format("float8_e4m3fn")


@pytest.mark.parametrize(("name", "storage"), [("bfloat16", ml_dtypes.bfloat16),
                                               ("float16", np.float16)])
def test_rounding_to_its_own_format_keeps_every_value(name, storage):
    fmt = get_format(name)
    assert RoundQuantizer(fmt).identity_on(fmt)
    values = np.arange(1 << 16, dtype=np.uint16).view(storage).astype(np.float32)
    values = values[~np.isnan(values)]
    out = np.asarray(quantize(values, name), np.float32)
    np.testing.assert_array_equal(out.view(np.uint32), values.view(np.uint32))


def test_only_rounding_to_the_operands_own_format_claims_it():
    assert not RoundQuantizer(BF16).identity_on(FP32)  # float32 -> bfloat16 rounds
    assert not RoundQuantizer(BF16).identity_on(FP16)
    assert not RoundQuantizer(BF16).identity_on(None)  # float64 or another dtype
    for fmt in (BF16, FP16, FP32):  # torchao's unquantised operand: its own format
        assert IdentityQuantizer().for_input(fmt).identity_on(fmt)
    assert not IdentityQuantizer().identity_on(BF16)  # by itself: rounding to float32
    scaled = [Fp8TensorQuantizer(E4M3), Fp8BlockQuantizer(E4M3), MXQuantizer(E4M3),
              NVFP4Quantizer()]
    for q in scaled:
        for fmt in (BF16, FP16, FP32, E4M3):
            assert not q.identity_on(fmt), (q, fmt)
