"""A matrix product with low-precision inputs and an optionally low-precision accumulator.

Contract: `lowp_matmul(a, b, input_format=fmt)` rounds both inputs to `fmt`, forms every
product in float32 and accumulates them in float32 in the order k = 0, 1, ..., K-1 (a
sequential sum, the worst case for rounding-error growth, not numpy's pairwise/BLAS
order). With `accumulate_format` the running sum is rounded to that format after every
`chunk` additions (and once more after the last term), which exposes accumulation
error: chunk=1 models an accumulator held in the format; chunk=c models partial sums
kept in float32 for c terms between roundings. Vectorised over the (M, N) output; the
Python loop runs over k only.

Dimension letters: M rows of a, K the contracted dimension, N columns of b.

Micikevicius et al., ICLR 2018 (float32 accumulation of fp16 products); Wang et al.,
"Training Deep Neural Networks with 8-bit Floating Point Numbers", NeurIPS 2018 (chunked
accumulation).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_int, native_dtype
from normlab.precision.formats.format import Format, get_format
from normlab.precision.formats.rounding import quantize

__all__ = ["lowp_matmul"]


def _as_f32(x: Any, name: str) -> np.ndarray:
    arr = as_float_array(x, name)
    if arr.ndim not in (1, 2):
        raise ValueError(f"{name} must be 1-D or 2-D; got shape {arr.shape}")
    if native_dtype(arr.dtype) == np.float64:  # '>f8' too: never a silent float32 detour
        return arr.astype(np.float64, copy=False)  # rounded once from float64 by quantize
    return arr.astype(np.float32)


def lowp_matmul(
    a: Any,
    b: Any,
    *,
    input_format: Format | str,
    accumulate_format: Format | str | None = None,
    chunk: int | None = None,
    rounding: str = "nearest",
    saturate: bool = False,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """`C = round_in(a) @ round_in(b)` with float32 products and a controlled accumulator.

    `acc_0 = 0; acc_k = acc_{k-1} + a[:, k] * b[k, :]` in float32; with
    `accumulate_format`, `acc <- round_acc(acc)` after additions c, 2c, ... and after
    the last one (c = chunk, default 1).

    Parameters
    ----------
    a, b : numpy.ndarray
        (M, K) or (K,), and (K, N) or (K,) float arrays (numpy matmul shapes); float64 of
        either byte order is rounded once from float64, other dtypes go through float32.
    input_format : Format or str
        The format both inputs are rounded to (e.g. `"bf16"`, `"e4m3"`).
    accumulate_format : Format or str, optional
        The format of the accumulator, or None for float32 accumulation.
    chunk : int, optional
        Additions between accumulator roundings (>= 1); needs `accumulate_format`.
    rounding : str
        Rounding mode for the inputs and the accumulator (`"stochastic"` needs `rng`).
    saturate : bool
        Inputs beyond the format's range become +-max instead of inf/NaN.
    rng : numpy.random.Generator, optional
        The randomness of stochastic rounding.

    Returns
    -------
    numpy.ndarray
        float32, of shape (M, N), (M,), (N,) or () following numpy's matmul rules.

    Raises
    ------
    TypeError, ValueError
        Non-float inputs, bad shapes, chunk without accumulate_format.

    Examples
    --------
    >>> a = np.ones((1, 4), np.float32); b = np.full((4, 1), 1 + 2.0**-9, np.float32)
    >>> lowp_matmul(a, b, input_format="fp32", accumulate_format="bf16").item()
    4.0
    """
    a2, b2 = _as_f32(a, "a"), _as_f32(b, "b")
    fin = get_format(input_format)
    facc = None if accumulate_format is None else get_format(accumulate_format)
    if chunk is not None:
        if facc is None:
            raise ValueError("chunk needs accumulate_format (float32 accumulation is unrounded)")
        c = check_int(chunk, "chunk", minimum=1)
    else:
        c = 1
    k_a = a2.shape[-1]
    k_b = b2.shape[0]
    if k_a != k_b:
        raise ValueError(
            f"a and b must share the contracted dimension K: a has shape {a2.shape}, "
            f"b has shape {b2.shape} ({k_a} != {k_b})"
        )
    qa = quantize(a2, fin, rounding=rounding, saturate=saturate, rng=rng).astype(np.float32)
    qb = quantize(b2, fin, rounding=rounding, saturate=saturate, rng=rng).astype(np.float32)
    am = qa.reshape(1, -1) if qa.ndim == 1 else qa  # M,K
    bm = qb.reshape(-1, 1) if qb.ndim == 1 else qb  # K,N
    acc = np.zeros((am.shape[0], bm.shape[1]), np.float32)  # M,N
    with np.errstate(over="ignore", invalid="ignore"):
        for k in range(k_a):
            acc += np.multiply.outer(am[:, k], bm[k, :])  # M,N  products in float32
            if facc is not None and ((k + 1) % c == 0 or k == k_a - 1):
                acc = quantize(acc, facc, rounding=rounding, rng=rng)
    if qa.ndim == 1 and qb.ndim == 1:
        return acc.reshape(())
    if qa.ndim == 1:
        return acc.reshape(-1)  # N
    if qb.ndim == 1:
        return acc.reshape(-1)  # M
    return acc
