"""Inverted dropout kernel: compare, mask and scale fused in one pass (numba).

Dimension letters: N elements (flattened C order).

Contract: receives the validated `(x, drop_probability, rng)` of `_inverted_dropout_ref`
(`normlab.dropout`) and returns `(out, keep)` bit-identical to the reference for the
same generator state. The uniforms are drawn exactly as the listing draws them,
`rng.random(x.shape)` (float64, C order), so the generator advances identically; the
kernel then computes `keep = u >= p` and `out = (x * keep) / (1 - p)` in x's dtype in
one sweep instead of NumPy's four temporaries. No fastmath: the division must not become a
multiplication by a reciprocal. Served: float32/float64 x and a Python `float`/`int` p
(NumPy scalars change the result dtype under NumPy's promotion rules: the reference runs).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.kernels import dropout_jit as jit
from normlab.kernels._adapt import FLOATS, launch

__all__: list[str] = []


def inverted_dropout(x: np.ndarray, drop_probability: Any, rng: np.random.Generator,
                     dest: tuple[Any, ...] = (None, None)) -> Any:
    """Kernel of `_inverted_dropout_ref`: same draw, fused mask and scale.

    `dest`: the validated `out=` buffers, written in place (out may be x: element i of
    x is read before element i of out is written).
    """
    if x.dtype not in FLOATS or type(drop_probability) not in (float, int):
        return NotImplemented
    u = rng.random(x.shape)  # (*x.shape) float64: the listing's draw, same generator state
    p = float(drop_probability)
    q = np.array(1 - drop_probability, dtype=x.dtype)[()]  # NumPy casts the weak scalar
    out = np.empty(x.shape, x.dtype) if dest[0] is None else dest[0]
    keep = np.empty(x.shape, np.bool_) if dest[1] is None else dest[1]
    launch(jit.mask_scale, x.size, np.ascontiguousarray(x).reshape(-1), u.reshape(-1), p, q,
           out.reshape(-1), keep.reshape(-1))
    return out, keep
