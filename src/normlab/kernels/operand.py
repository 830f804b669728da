"""Operand kernels: the numba side of [normlab.precision.operands.operand][] (the adapter).

Dimension letters: R, C the logical operand; A, B the array as it lies in memory (the
operand, or its transpose when its columns are contiguous).

Contract: `fake_operand`, `encode_operand`, `fake_encode_operand`, `decode_operand` and
`tensor_amax` receive the reference's
validated arguments (`normlab._backend.KERNELS` names them) and return the same values,
dtypes, shapes and layout, or `NotImplemented` (input that is not a 2-D float32 or
bfloat16 array with contiguous rows or columns, a format outside the loops' reach: more
than 16 bits, no zero or sign, "fnuz" NaNs, stochastic rounding other than NVFP4's).

What runs: block amaxes in one read-only pass over the operand's bits (bfloat16 read in place),
the recipe's scale rule on the small block grid through the shared functions
([normlab.precision.scaled.block_scales][], [normlab.precision.scaled.arithmetic][], NumPy
namespace: the same code the reference runs), then one pass that multiplies, rounds, encodes and
dequantises each element (`operand_jit.encode_blocks`). Blocks are views of the operand's
memory: a block along the contiguous axis is a run of it, a block across it a column
stripe; nothing is padded or copied, and a transposed operand is read as it lies.
"""

from __future__ import annotations

import functools
from typing import Any

import ml_dtypes
import numpy as np

from normlab.kernels import amax_jit, block_scale_jit, operand_jit, scale_grid_jit
from normlab.kernels._adapt import launch
from normlab.kernels.quantize import narrow_nearest_serves, round_params
from normlab.precision.formats.format import FLOAT8_E4M3FN, Format, NanConvention
from normlab.precision.formats.modes import RoundingMode
from normlab.precision.operands.codes import Encoded, code_tables, stores_codes
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled import block_scales
from normlab.precision.scaled.namespace import F32_MAX, NUMPY
from normlab.precision.scaled.quantizers import (
    Fp8BlockQuantizer,
    Fp8TensorQuantizer,
    MXQuantizer,
    NVFP4Quantizer,
    Quantizer,
    RoundQuantizer,
)

__all__: list[str] = []

_F32 = np.dtype(np.float32)
_BF16 = np.dtype(ml_dtypes.bfloat16)
_EMPTY_F = np.zeros((0, 0), np.float32)
_EMPTY_U8 = np.zeros((0, 0), np.uint8)


def _nearest_args(params: tuple[Any, ...]) -> tuple[Any, ...]:
    """`round_params` of nearest rounding without `qbits`, which it does not use: `m, emin,
    maxbits, ovf, flush, inf_out, nan_keep, nan_out`."""
    return tuple(params[:2]) + tuple(params[3:])


def _code_args(fmt: Format) -> tuple[Any, ...]:
    """The encoding parameters of `_encode` for `fmt` but `m` (module header of
    `operand_jit`): `ebias, minnorm, sub_shift, nanc, infc, sbit`."""
    t = code_tables(fmt)
    return (127 - fmt.bias, np.float32(2.0**fmt.emin).view(np.uint32),
            fmt.emin - fmt.mantissa_bits + 150, t.nan_code, t.inf_code, t.sign_bit)


# NVFP4's block scales round to E4M3 to nearest even, saturating
_E4M3_SAT = _nearest_args(round_params(FLOAT8_E4M3FN, RoundingMode.NEAREST, True, _F32))


def _serves(fmt: Format) -> bool:
    """Formats the loops encode: codes of 16 bits or fewer, a sign and a zero, not "fnuz",
    in the reach of the float32 nearest-even trick."""
    return (stores_codes(fmt) and fmt.nan is not NanConvention.FNUZ
            and narrow_nearest_serves(fmt, RoundingMode.NEAREST, _F32))


def _physical(x: Any) -> tuple[np.ndarray, bool] | None:
    """(x's bits as they lie, shape (A, B); whether that is x transposed) or None."""
    if not isinstance(x, np.ndarray) or x.ndim != 2 or x.dtype not in (_F32, _BF16):
        return None
    bits = np.uint32 if x.dtype == _F32 else np.uint16
    if x.flags.c_contiguous:
        return x.view(bits), False
    if x.flags.f_contiguous:
        return x.T.view(bits), True
    return None


def _amax(xb: np.ndarray, ra: int, rb: int) -> np.ndarray:
    """float32 max |x| over each (ra, rb) block of the bits `xb` (A, B); NaN wins."""
    A, B = xb.shape
    mask = xb.dtype.type(2 ** (8 * xb.itemsize - 1) - 1)
    nA, nB = -(-A // ra), -(-B // rb)
    out = np.empty((nA, nB), xb.dtype)
    if rb == 1 and ra > 1:
        launch(amax_jit.amax_cols, xb.size, xb, ra, mask, out)
    elif ra == 1 and rb < B:
        launch(amax_jit.amax_row_blocks, xb.size, xb, rb, mask, out)
    elif ra == 1:  # whole rows
        launch(amax_jit.amax_rows, xb.size, xb, mask, out.reshape(-1))
    else:
        launch(block_scale_jit.amax_bits, xb.size, xb.reshape(1, A, B), ra, rb, mask,
               out.reshape(1, nA, nB))
    if xb.itemsize == 2:
        return (out.astype(np.uint32) << np.uint32(16)).view(np.float32)
    return out.view(np.float32)


def _memory_block(q: Quantizer, dims: tuple[int, int], transposed: bool) -> tuple[int, int]:
    """One block of `q` in memory (A, B) terms: the whole array for a quantizer without
    blocks, the logical block (transposed when the array is), a 0 (a block spanning its
    axis) made that axis' length."""
    r, c = q.block
    if (r, c) == (0, 0):
        return dims
    ra, rb = (c, r) if transposed else (r, c)
    return (ra or dims[0], rb or dims[1])


def _grid(a: np.ndarray) -> np.ndarray:
    return np.asarray(a, dtype=np.float32).reshape(a.shape if a.ndim == 2 else (1, 1)).copy()


_Factors = tuple[np.ndarray, np.ndarray, np.float32, Any, Any]


@functools.singledispatch
def _factors(q: Quantizer, xb: np.ndarray, block: tuple[int, int],
             scale: Any) -> _Factors | None:
    """(mul, d1, d2, scales, tensor_scale) on the memory grid; `scales` as the reference
    keeps them (before orientation). One registration per quantizer family; a family
    without one is declined (None), and its reference serves."""
    return None


@_factors.register
def _(q: RoundQuantizer, xb: np.ndarray, block: tuple[int, int], scale: Any) -> _Factors:
    one = np.ones((1, 1), np.float32)
    return one, one, np.float32(1.0), None, None


@_factors.register
def _(q: Fp8TensorQuantizer, xb: np.ndarray, block: tuple[int, int], scale: Any) -> _Factors:
    s = np.asarray(scale, np.float32)
    inv = np.float32(1.0) / s
    return _grid(s), _grid(inv), np.float32(1.0), inv, None


@_factors.register
def _(q: MXQuantizer, xb: np.ndarray, block: tuple[int, int], scale: Any) -> _Factors:
    amax = _amax(xb, *block)
    with NUMPY.quiet():
        mul, d1 = np.empty_like(amax), np.empty_like(amax)
        codes = np.empty(amax.shape, np.uint8)
        launch(scale_grid_jit.mx_grid, amax.size, amax, q.fmt.emax, q.rule == "round_up",
               np.float32(1.0 / q.fmt.max), mul, d1, codes)
        return mul, d1, np.float32(1.0), codes, None


@_factors.register
def _(q: NVFP4Quantizer, xb: np.ndarray, block: tuple[int, int], scale: Any) -> _Factors:
    amax = _amax(xb, *block)
    with NUMPY.quiet():
        # the tensor-level factors of `block_scales.nvfp4_scales`, then its per-block
        # steps compiled (`scale_grid_jit.nvfp4_grid`); the tensor amax is the grid's
        # max (non-negative; NaN wins, as in tensor_amax)
        s_mul, s_dec = (np.float32(f) for f in block_scales.nvfp4_tensor_factors(
            np.float32(amax.max()), xp=NUMPY))
        e_b, s_b = np.empty_like(amax), np.empty_like(amax)
        launch(scale_grid_jit.nvfp4_grid, amax.size, amax, s_mul, s_dec, *_E4M3_SAT,
               F32_MAX, e_b, s_b)
        return e_b, s_b, s_dec, s_b, s_dec


@_factors.register
def _(q: Fp8BlockQuantizer, xb: np.ndarray, block: tuple[int, int], scale: Any) -> _Factors:
    amax = _amax(xb, *block)
    with NUMPY.quiet():
        s = block_scales.blockwise_scales(amax, q.fmt, epsilon=q.epsilon,
                                          power_of_2_scales=q.pow2, value_for_inf=F32_MAX,
                                          nonfinite_nan=q.nonfinite_nan, xp=NUMPY)
        inv = np.float32(1.0) / s
        return _grid(s), _grid(inv), np.float32(1.0), inv, None


@functools.singledispatch
def _stored(q: Quantizer, grid: np.ndarray) -> np.ndarray:
    """The scales as the reference stores them: the grid itself (float32 or codes)..."""
    return grid


@_stored.register
def _(q: NVFP4Quantizer, grid: np.ndarray) -> np.ndarray:
    return _e4m3_codes(grid)  # ... E4M3 codes of NVFP4's block scales


def _logical_scales(scales: Any, q: Quantizer, transposed: bool) -> Any:
    """Memory-grid scales in the reference's layout: the logical grid (a quantizer whose
    `scales_transposed`: the grid of the transposed operand), as stored."""
    if scales is None or np.ndim(scales) == 0:
        return scales
    flip = transposed != q.scales_transposed
    grid = np.ascontiguousarray(scales.T if flip else scales)
    # a grid with a size-1 axis (one scale per row) is "contiguous" with any stride there;
    # give it C strides, as a fresh tensor of its shape has
    return _stored(q, grid.reshape(-1).reshape(grid.shape))


def _e4m3_codes(v: np.ndarray) -> np.ndarray:
    """E4M3 codes of float32 values E4M3 holds (NVFP4's block scales): the encode step of
    `encode_blocks` ([element_codes][normlab.precision.operands.codes.element_codes]'s
    values, without its search)."""
    ebias, *rest = _code_args(FLOAT8_E4M3FN)
    co = np.empty(v.shape, np.uint8)
    launch(operand_jit.encode_values, v.size, v.reshape(-1).view(np.uint32), ebias,
           FLOAT8_E4M3FN.mantissa_bits, *rest, co.reshape(-1))
    return co


def _run(x: Any, q: Quantizer, scale: Any, seed: int | None, order: str,
         values: bool, codes: bool) -> tuple[np.ndarray, np.ndarray, Any, Any] | None:
    """The encode pass: (values, codes, scales, tensor_scale), or None to decline."""
    phys = _physical(x)
    if phys is None or not _serves(q.fmt) or (seed is not None and not q.stochastic):
        return None
    xb, transposed = phys
    A, B = xb.shape
    block = _memory_block(q, (A, B), transposed)
    factors = _factors(q, xb, block, scale)
    if factors is None:
        return None
    mul, d1, d2, scales, tensor_scale = factors
    flip = transposed != (order == "F")
    stored = (B, A) if flip else (A, B)
    fmt = q.fmt
    params = round_params(fmt, RoundingMode.NEAREST, q.saturates, _F32)
    if values and codes:  # one scale, no blocks, stored as it lies: both in one pass
        vo = np.empty(stored, np.float32)
        co = np.empty(stored, np.uint8 if fmt.bits <= 8 else np.int16)
        launch(operand_jit.fake_encode_flat, xb.size, xb, mul[0, 0], d1[0, 0],
               *_nearest_args(params), *_code_args(fmt), vo, co)
    elif values:
        vo = np.empty(stored, np.float32)
        wa, wb = (1, A) if transposed else (B, 1)
        kern = operand_jit.fake_blocks(block[1], B, d1.shape[1], seed is not None)
        launch(kern, xb.size, xb, block[0], block[1], mul, d1, d2, *params, seed is not None,
               np.uint64(0 if seed is None else seed % 2**64), wa, wb, flip, vo)
        co = _EMPTY_U8
    else:
        packed = q.packed
        cshape = (stored[0], -(-stored[1] // 2)) if packed else stored
        co = np.zeros(cshape, np.uint8 if fmt.bits <= 8 else np.int16)
        launch(operand_jit.encode_blocks, xb.size, xb, block[0], block[1], mul, d1,
               *_nearest_args(params), *_code_args(fmt), flip, packed, co)
        vo = _EMPTY_F
    out_v = vo if order == "C" else vo.T
    kept = _logical_scales(scales, q, transposed) if codes else None
    return out_v, co, kept, tensor_scale


def fake_operand(x: Any, q: Quantizer, scale: Any, seed: int | None, order: str) -> Any:
    """Kernel of the reference `fake_operand`."""
    done = _run(x, q, scale, seed, order, values=True, codes=False)
    return NotImplemented if done is None else done[0]


def fake_encode_operand(x: Any, q: Quantizer, scale: Any, order: str) -> Any:
    """Kernel of the reference `fake_encode_operand` (quantizers without blocks, the result
    stored as the input lies; the rest declines: their reference runs the two kernels)."""
    phys = _physical(x)
    if not q.axis_free or phys is None or phys[1] != (order == "F"):
        return NotImplemented
    done = _run(x, q, scale, None, order, values=True, codes=True)
    if done is None:
        return NotImplemented
    vo, co, scales, tensor_scale = done
    return vo, Encoded(co, scales, tensor_scale)


def encode_operand(x: Any, q: Quantizer, scale: Any, order: str) -> Any:
    """Kernel of the reference `encode_operand`."""
    done = _run(x, q, scale, None, order, values=False, codes=True)
    if done is None:
        return NotImplemented
    _, co, scales, tensor_scale = done
    return q.encoded(co, scales, tensor_scale)


def tensor_amax(x: Any) -> Any:
    """max |x| of a 2-D float32 or bfloat16 array with contiguous rows or columns, as a
    float32 scalar (the quiet NaN if x holds a NaN), or `NotImplemented`: the value of
    [tensor_amax][normlab.precision.scaled.arithmetic.tensor_amax] (a max is one of the inputs,
    exact in any order)."""
    phys = _physical(x)
    if phys is None or x.size == 0:
        return NotImplemented
    xb = phys[0]
    top = _amax(xb, 1, xb.shape[1]).max()  # each row's max, then theirs (NaN wins)
    return np.float32(np.nan) if top != top else np.float32(top)


@functools.singledispatch
def _decode_grid(q: Quantizer, enc: Encoded) -> tuple[np.ndarray | None, np.float32] | None:
    """(the logical grid of float32 factors or None for one of 1, d2) of `enc`'s scales;
    None (declined) for a family without a registration."""
    return None


@_decode_grid.register
def _(q: RoundQuantizer, enc: Encoded) -> tuple[np.ndarray | None, np.float32]:
    return None, np.float32(1.0)


@_decode_grid.register
def _(q: Fp8TensorQuantizer, enc: Encoded) -> tuple[np.ndarray | None, np.float32]:
    return np.asarray(enc.scales), np.float32(1.0)


@_decode_grid.register
def _(q: Fp8BlockQuantizer, enc: Encoded) -> tuple[np.ndarray | None, np.float32]:
    return (enc.scales.T if q.scales_transposed else enc.scales), np.float32(1.0)


@_decode_grid.register
def _(q: MXQuantizer, enc: Encoded) -> tuple[np.ndarray | None, np.float32]:
    return core.e8m0_values(enc.scales, xp=NUMPY), np.float32(1.0)


@_decode_grid.register
def _(q: NVFP4Quantizer, enc: Encoded) -> tuple[np.ndarray | None, np.float32]:
    return code_tables(FLOAT8_E4M3FN).values[enc.scales], np.float32(enc.tensor_scale)


def decode_operand(enc: Encoded, q: Quantizer, shape: tuple[int, int], order: str) -> Any:
    """Kernel of the reference `decode_operand`."""
    co = enc.codes
    if (not isinstance(co, np.ndarray) or co.ndim != 2 or not co.flags.c_contiguous
            or not _serves(q.fmt)):
        return NotImplemented
    R, C = shape
    stored = (C, R) if order == "F" else (R, C)
    block = _memory_block(q, stored, order == "F")
    grid = _decode_grid(q, enc)
    if grid is None:
        return NotImplemented
    logical, d2 = grid
    if logical is None:
        d1 = np.ones((1, 1), np.float32)
    elif logical.ndim == 0:
        d1 = _grid(logical)
    else:
        d1 = _grid(logical.T if order == "F" else logical)
    vo = np.empty(stored, np.float32)
    launch(operand_jit.decode_blocks, vo.size, co, block[0], block[1],
           code_tables(q.fmt).values, d1, d2, q.packed, vo)
    return vo if order == "C" else vo.T
