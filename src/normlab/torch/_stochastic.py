"""Stochastic rounding of torch tensors: SplitMix64 words and fast exact paths.

Dimension letters: N elements (the flattened C-order input), C elements of one chunk.

Contract: the same bits as the reference rule of `normlab.precision.formats.rounding` for the
stochastic mode, with element i using the 64-bit word `w_i` (`splitmix64((seed + i) mod 2^64)`
or given): write |x| = (keep + f) * 2^qe with qe = max(floor(log2|x|), emin) - m,
keep an integer and 0 <= f < 1; the magnitude goes up one quantum iff
`r64 + w >= 2^64` with `r64 = floor(f * 2^64)` (the reference's rem << (64 - d) for
d <= 64 and rem >> (d - 64) beyond are both this floor). That is `r64 > ~w` as uint64.
64-bit words live in int64 tensors with the same bits; adds and multiplies wrap mod 2^64,
logical shifts are arithmetic shifts masked, unsigned order is signed order with the sign
bits flipped.

Two exact shortcuts for float32 input, both checked bit for bit against the reference:

* Same exponent range (bf16, any E8My with bias 127 and IEEE specials): every quantum is
  2^d units of the float32 bits, d = 23 - m, subnormals included, so `up` is
  `rem + (w >> (64 - d)) >= 2^d` (only the top d <= 31 bits of w matter) and
  `(bits + (w >> (64 - d))) & ~(2^d - 1)` is the rounded magnitude; a carry moves into
  the exponent field, from max it lands on the infinity bits.
* Scaled (fp16, the fp8 formats, fp6, fp4: quanta are normal float32 powers of two):
  y = |x| / 2^qe is exact, keep = floor(y), f = y - keep (exact), and r64 is read without
  a 64-bit shift: for f < 1/2, r64 = floor(f 2^64) < 2^63 converts exactly; for f >= 1/2,
  f - 1/2 is exact (same binade) and r64 = 2^63 + floor((f - 1/2) 2^64).

Everything else (float64 input, flush-to-zero, unsigned and zeroless formats) takes the
general bit path of [normlab.torch.quantize][]. On the CPU large tensors are rounded
`CHUNK` elements at a time, so every temporary stays in cache (the words of a chunk
starting at i0 are `splitmix64(seed + i0 + j)`: chunking changes no bit); compiled
graphs and other devices round in one piece.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from normlab.precision.formats.format import Format, NanConvention
from normlab.precision.formats.random_bits import GOLDEN_GAMMA
from normlab.torch._import import torch

__all__ = [
    "CHUNK", "fast_kernel", "round_chunked", "splitmix64", "splitmix64_int",
    "stochastic_words",
]

CHUNK = 1 << 16  # elements per CPU chunk: a few int64/float32 temporaries fit in L2
_I64_MIN, _I64_MAX = -(2**63), 2**63 - 1
_I32_MIN, _I32_MAX = -(2**31), 2**31 - 1
_INF32, _QNAN32 = 0x7F800000, 0x7FC00000
_TWO64 = 2.0**64  # 0x1p64 (a float32 power of two)
_MIX1 = 0xBF58476D1CE4E5B9
_MIX2 = 0x94D049BB133111EB
# words -> rounded chunk; both float32 (C,), the words int64 (C,)
Kernel = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _i64(v: int) -> int:
    """The int64 whose bits are the uint64 `v mod 2^64` (no branch on v)."""
    return (int(v) + 2**63) % 2**64 - 2**63


def _mix(z: torch.Tensor, *, top_only: bool = False) -> torch.Tensor:
    """SplitMix64's finaliser of z = state + golden gamma, in place on `z` (int64 bits).

    `top_only` skips the last xor-shift `z ^ (z >> 31)`, which leaves the top 31 bits
    unchanged: enough for callers that read only those.
    """
    z ^= (z >> 30) & ((1 << 34) - 1)  # logical z >> 30
    z *= _i64(_MIX1)  # wraps mod 2^64: the same bits as the uint64 product
    z ^= (z >> 27) & ((1 << 37) - 1)
    z *= _i64(_MIX2)
    if not top_only:
        z ^= (z >> 31) & ((1 << 33) - 1)
    return z


def splitmix64(counter: torch.Tensor) -> torch.Tensor:
    """SplitMix64 of each uint64 state held (as its bits) in an int64 tensor.

    The same formula as [normlab.precision.splitmix64][], in wrapping int64 arithmetic
    (adds and multiplies mod 2^64 give the same bits signed or unsigned).

    Parameters
    ----------
    counter : torch.Tensor
        Int64, any shape and device: the bits of the uint64 states.

    Returns
    -------
    words : torch.Tensor
        Int64, the shape and device of `counter`: the bits of the uint64 outputs.

    Examples
    --------
    >>> hex(int(splitmix64(torch.zeros(1, dtype=torch.int64))[0]) % 2**64)
    '0xe220a8397b1dcdaf'
    """
    return _mix(counter + _i64(GOLDEN_GAMMA))


def splitmix64_int(state: int) -> int:
    """SplitMix64 of one uint64 state, on Python ints (the value the array functions give).

    Plain integer arithmetic, so `torch.compile` folds it into a constant where the
    state is one (NumPy uint64 scalars are not traceable).

    Examples
    --------
    >>> hex(splitmix64_int(0))
    '0xe220a8397b1dcdaf'
    """
    mask = 2**64 - 1
    z = (int(state) + GOLDEN_GAMMA) & mask
    z = ((z ^ (z >> 30)) * _MIX1) & mask
    z = ((z ^ (z >> 27)) * _MIX2) & mask
    return z ^ (z >> 31)


def _words(seed: int, start: int, n: int, device: Any, *, top_only: bool = False) -> torch.Tensor:
    """`splitmix64(seed + start + j)` for j < n: (n,) int64 (see `_mix`)."""
    z = torch.arange(n, dtype=torch.int64, device=device)  # (C,)
    # seed enters as two 32-bit halves and every Python-side constant fits int64: under
    # torch.compile the seed may be a symbolic int, and the generated code is int64
    hi, lo = seed // 2**32, seed % 2**32
    z += _i64(start + GOLDEN_GAMMA) + lo
    z += torch.full((), hi, dtype=torch.int64, device=device) << 32  # wraps mod 2^64
    return _mix(z, top_only=top_only)


def stochastic_words(
    seed: int, shape: tuple[int, ...] | torch.Size, device: Any = None
) -> torch.Tensor:
    """The words `splitmix64(seed + i)` of an array of `shape`, as int64 bits.

    Bit-identical to [normlab.precision.stochastic_words][] viewed as int64.

    Parameters
    ----------
    seed : int
        Any integer, taken mod 2^64.
    shape : tuple of int
        i runs over the flattened C order of this shape.
    device : torch.device or str, optional
        Where the words are made; None (the default) is torch's default device.

    Returns
    -------
    words : torch.Tensor
        Int64 with `shape` on `device`.

    Examples
    --------
    >>> stochastic_words(7, (2, 3)).shape
    torch.Size([2, 3])
    """
    n = 1
    for size in shape:
        n *= int(size)
    return _words(seed, 0, n, device).reshape(tuple(shape))


def _nan_flags(a: torch.Tensor) -> torch.Tensor:
    """1 where the float32 magnitude bits `a` (int32, >= 0) are a NaN, else 0 (int32).

    Integer clamps instead of a comparison and a select: both are many times slower than
    an arithmetic pass on the CPU.
    """
    return (a.clamp(max=_INF32 + 1) - _INF32).clamp_(0, 1)


def _same_range(fmt: Format, saturate: bool) -> Kernel:
    """Kernel for formats with float32's exponent field (bf16): add the top d bits of w."""
    d = 23 - fmt.mantissa_bits  # 1 <= d <= 22
    max_bits = _INF32 - (1 << d)  # the largest finite value: all-ones kept mantissa

    def kernel(x: torch.Tensor, top: torch.Tensor) -> torch.Tensor:
        raw = x.view(torch.int32)  # (C,)
        a = (raw & _I32_MAX).clamp_(max=_INF32 + 1)  # every NaN -> INF + 1: no overflow
        r = a + ((top >> (64 - d)) & ((1 << d) - 1)).to(torch.int32)  # + top d bits of w
        r &= ~((1 << d) - 1)  # <= INF + 2^d <= the quiet NaN bits for a NaN
        if saturate:
            r.clamp_(max=max_bits)  # overflow and infinities -> max
        r = torch.maximum(r, _nan_flags(a) * _QNAN32)  # NaN -> the quiet NaN 0x7FC00000
        return (r | (raw & _I32_MIN)).view(torch.float32)

    return kernel


def _scaled(fmt: Format, saturate: bool) -> Kernel:
    """Kernel for formats whose quanta are normal float32 powers of two (fp16, fp8, fp4)."""
    m = fmt.mantissa_bits
    lo, hi = fmt.emin + 127, fmt.emax + 128  # biased exponent of |x|, clamped
    # above 2^(emax + 1) every magnitude overflows, whatever quantum it is rounded with
    # float32 bits of max = max_significand 2^(emax - m) (plain ints: nothing to trace)
    max_bits = ((fmt.emax + 127) << 23) | ((fmt.max_significand - (1 << m)) << (23 - m))
    clamp = saturate or not fmt.has_nan
    over_bits = _INF32 if fmt.has_infinity else _QNAN32

    def kernel(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        raw = x.view(torch.int32)  # (C,)
        a = raw & _I32_MAX  # |x| bits
        p = (a >> 23).clamp_(lo, hi)  # qe = p - 127 - m
        y = a.view(torch.float32) * ((254 + m - p) << 23).view(torch.float32)  # |x|/2^qe
        y = torch.nan_to_num_(y, nan=0.0, posinf=2.0**24)  # NaN: set below; inf: overflows
        keep = torch.floor(y)
        t2 = (y - keep).mul_(2.0)  # 2f, exact, in [0, 2)
        b = torch.floor(t2)  # the top bit of r64 = floor(f 2^64)
        key = (t2 - b).mul_(2.0**63).to(torch.int64)  # r64's low 63 bits, exact
        key += (b - 1.0).mul_(2.0**63).to(torch.int64)  # sign bit: r64 ^ MIN (unsigned order)
        n = keep.add_(key > (w ^ _I64_MAX))  # r64 > ~w as uint64; (~w) ^ MIN == w ^ MAX
        bits = n.mul_(((p - m) << 23).view(torch.float32)).view(torch.int32)  # n 2^qe >= 0
        if clamp:
            bits.clamp_(max=max_bits)
        else:  # above max: inf, or NaN without inf
            over = (bits - max_bits).clamp_(0, 1)
            bits = torch.maximum(bits.clamp_(max=max_bits), over * over_bits)
        bits = torch.maximum(bits, _nan_flags(a) * _QNAN32)
        sign = raw & _I32_MIN
        if fmt.nan is NanConvention.FNUZ:  # no -0: zero results are +0
            sign &= -bits.clamp(max=1)
        return (bits | sign).view(torch.float32)

    return kernel


def fast_kernel(fmt: Format, saturate: bool) -> tuple[Kernel, bool] | None:
    """(kernel, reads only the top 31 bits of the words) for `fmt`, or None.

    None means the general bit path: formats without subnormals, without a zero or
    without a sign, and quanta outside float32's normal range other than bf16's.
    """
    if not (fmt.signed and fmt.has_zero and fmt.has_subnormals) or fmt.mantissa_bits < 1:
        return None
    m = fmt.mantissa_bits
    if (fmt.emin, fmt.emax, fmt.nan) == (-126, 127, NanConvention.IEEE):
        return _same_range(fmt, saturate), True
    # 2^qe and 2^-qe must be normal float32 for every clamped exponent
    if fmt.emin - m >= -126 and fmt.emax + 1 - m <= 126 and m - fmt.emin <= 126:
        return _scaled(fmt, saturate), False
    return None


def round_chunked(
    x: torch.Tensor, kernel: Kernel, seed: int | None, words: torch.Tensor | None,
    *, top_only: bool = False,
) -> torch.Tensor:
    """Apply `kernel(x_chunk, w_chunk)` over contiguous `x` with its words.

    Parameters
    ----------
    x : torch.Tensor
        Contiguous, any shape (flattened in C order).
    kernel : Kernel
        Maps (C,) elements and their (C,) int64 words to (C,) results.
    seed, words : int or torch.Tensor
        Exactly one: the SplitMix64 seed, or the (N,) int64 words.
    top_only : bool, optional
        The kernel reads only the top 31 bits of generated words. Default False.

    Returns
    -------
    out : torch.Tensor
        The shape of `x`: the kernel's results in x's order.
    """
    flat = x.reshape(-1)  # (N,)
    n = flat.numel()

    def w_of(i0: int, c: int) -> torch.Tensor:
        if words is not None:
            return words[i0 : i0 + c]
        assert seed is not None
        return _words(seed, i0, c, flat.device, top_only=top_only)

    if torch.compiler.is_compiling() or flat.device.type != "cpu" or n <= CHUNK:
        return kernel(flat, w_of(0, n)).reshape(x.shape)
    out = torch.empty_like(flat)
    for i0 in range(0, n, CHUNK):
        c = min(CHUNK, n - i0)
        out[i0 : i0 + c] = kernel(flat[i0 : i0 + c], w_of(i0, c))
    return out.reshape(x.shape)
