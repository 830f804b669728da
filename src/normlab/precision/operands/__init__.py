"""Training operands: a GEMM operand under its quantizer, and the codes saved for backward.

* `operand`: fake-quantise, encode and decode one operand with its quantizer;
* `codes`: the element codes an operand is saved as (lookup tables, packing);
* `one_pass`: the forward GEMM's input and its saved copy from one pass.

Every name of the old module `normlab.precision.operands` is importable from this package,
as before. They are looked up on first use: the quantizers import `codes`, and `operand`
imports the quantizers, so importing `operand` here would close an import circle.
"""

from __future__ import annotations

import importlib
from typing import Any

__all__ = ["decode_operand", "encode_operand", "fake_operand", "operand_spec"]


def __getattr__(name: str) -> Any:
    # the public functions, and `OperandSpec`, which warns in `operand` as it did here
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(importlib.import_module("normlab.precision.operands.operand"), name)
