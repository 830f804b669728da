"""Exact rounding of torch tensors to any [Format][normlab.precision.Format], on the bits.

Dimension letters: N elements (the flattened C-order input).

Contract: for float32 and float64 inputs the result is bit-identical to
`normlab.precision.quantize(t.cpu().numpy(), ...)` in every mode, with the same special
rules (see `normlab.precision.formats.rounding`, whose algorithm this mirrors step by step):
the integer significand `s` of |x| loses `d = qe - (e - F)` low bits, the mode decides
whether to add one, a carry renormalises, then overflow, infinity, NaN, zero and sign rules
apply. Everything runs as torch tensor ops on int64 views of the bits, so one code path
serves every device. torch has no uint64 arithmetic on all devices: 64-bit words live in
int64 with the same bits, shifts of words are made logical by masking, and unsigned
comparisons flip the sign bit of both sides first. Round-to-nearest into bf16, fp16 and
the OCP fp8 formats takes faster routes with the same bits: large CPU tensors chunk by
chunk (`normlab.torch._cpuround`), the rest whole-tensor casts (`_nearest_by_cast`).

bfloat16 and float16 inputs are widened to float32 (exact), rounded there, and cast back
with the input dtype's round-to-nearest-even; the cast is exact whenever the format's
values are values of the input dtype (any format no wider than it), otherwise it is a
second rounding.

Stochastic rounding takes `random_bits` (an int64 tensor with the bits of NumPy's
uint64 words) or `seed`: element i of the flattened tensor uses
`splitmix64(seed + i)` ([normlab.precision.formats.random_bits][]), on every device.
float32 input to bf16, fp16, the fp8/fp6/fp4 formats (signed, with subnormals) takes the
fast kernels of `normlab.torch._stochastic` (the same bits, a fraction of the passes);
on the CPU large tensors are rounded in chunks, their words generated per chunk.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._moved import renamed_arguments
from normlab.precision.formats.format import (
    Format,
)
from normlab.precision.formats.modes import RoundingMode, check_mode
from normlab.precision.formats.random_bits import check_seed, stochastic_source
from normlab.precision.formats.rounding import specials
from normlab.torch._cpuround import nearest_chunks, use_chunks
from normlab.torch._import import torch
from normlab.torch._stochastic import fast_kernel, round_chunked, splitmix64, stochastic_words
from normlab.torch.formats import NATIVE_DTYPES, get_format, quiet_nan_where

__all__ = ["quantize", "splitmix64", "stochastic_words"]

# Input types: (stored mantissa bits F, exponent bias B, width W, signed view type).
_INPUT = {
    torch.float32: (23, 127, 32, torch.int32),
    torch.float64: (52, 1023, 64, torch.int64),
}
_WIDENED = (torch.bfloat16, torch.float16)
_FINITE, _INF, _NAN = 0, 1, 2
_I64_MIN = -(2**63)


def _floor_log2(s: torch.Tensor) -> torch.Tensor:
    """floor(log2 s) of positive int64 s < 2^53 (exact: read from the float64 exponent)."""
    return (s.to(torch.float64).view(torch.int64) >> 52) - 1023


def _shl(a: torch.Tensor, k: torch.Tensor) -> torch.Tensor:
    """a << k for int64 tensors, 0 where k >= 64 (shift counts clamped, never wrapped)."""
    return torch.where(k >= 64, 0, a << k.clamp(0, 63))


def _round_up(
    mode: RoundingMode, sign: torch.Tensor, keep: torch.Tensor, rem: torch.Tensor,
    d: torch.Tensor, words: torch.Tensor | None,
) -> torch.Tensor:
    """Whether each kept significand goes up one unit (bool, (N,))."""
    if mode is RoundingMode.TOWARD_ZERO:
        return torch.zeros_like(sign)
    if mode is RoundingMode.TOWARD_POSITIVE:
        return (rem > 0) & ~sign  # rem, not a fixed-point fraction: exact for any d
    if mode is RoundingMode.TOWARD_NEGATIVE:
        return (rem > 0) & sign
    if mode is RoundingMode.STOCHASTIC:
        assert words is not None
        # rem / 2^d as a 0.64 fixed-point fraction, exactly as the NumPy reference
        r64 = torch.where(d <= 64, _shl(rem, 64 - d), rem >> (d - 64).clamp(0, 63))
        # r64 + w >= 2^64  <=>  r64 > ~w as uint64: compare with both sign bits flipped
        return (r64 ^ _I64_MIN) > (~words ^ _I64_MIN)
    # d >= 63 leaves rem = s < 2^53, below any half from the clamp: never up, as in NumPy
    half = 1 << (d.clamp(1, 62) - 1)  # (N,) 2^(d-1); d == 0 has rem == 0 < 1
    if mode is RoundingMode.NEAREST_AWAY:
        return rem >= half
    return (rem > half) | ((rem == half) & ((keep & 1) == 1))


def _components(
    x: torch.Tensor, fmt: Format, mode: RoundingMode, words: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rounded (sign, n, qe, kind, t, s) of every element, as in `round_components`."""
    F, B, W, itype = _INPUT[x.dtype]
    m = fmt.mantissa_bits
    raw = x.reshape(-1).view(itype)  # (N,)
    sign = raw < 0
    a = (raw & ((1 << (W - 1)) - 1)).to(torch.int64)
    E = a >> F
    frac = a & ((1 << F) - 1)
    top = 2 ** (W - F - 1) - 1
    kind = torch.where(E == top, torch.where(frac == 0, _INF, _NAN), _FINITE)
    s = torch.where(E > 0, frac | (1 << F), frac)  # (N,) significand
    e = E.clamp(min=1) - B
    t = _floor_log2(s) + e - F  # floor(log2|x|) where s > 0
    qe = t.clamp(min=fmt.emin) - m
    d = torch.where(s > 0, qe - (e - F), 0)
    dc = d.clamp(0, 63)  # s < 2^53, so shifting by 63 already leaves 0
    keep = s >> dc
    rem = s - (keep << dc)
    n = keep + _round_up(mode, sign, keep, rem, d, words).to(torch.int64)
    carry = (n >> (m + 1)) != 0
    n = torch.where(carry, n >> 1, n)
    qe = torch.where(carry, qe + 1, qe)
    if not fmt.has_zero:  # no zero, no subnormals: below min_normal -> min_normal
        low = (s > 0) & (t < fmt.emin)
        n = torch.where(low, 1 << m, n)
        qe = torch.where(low, fmt.emin - m, qe)
    elif not fmt.has_subnormals:  # flush-to-zero format: subnormal results become 0
        n = torch.where(n < (1 << m), 0, n)
    return sign, n, qe, kind, t, s


def _assemble(
    sign: torch.Tensor, n: torch.Tensor, qe: torch.Tensor, kind: torch.Tensor,
    dtype: torch.dtype,
) -> torch.Tensor:
    """(-1)^sign * n * 2^qe in `dtype` (exact: n < 2^25 and the value is representable)."""
    _, _, W, itype = _INPUT[dtype]
    pow2 = ((qe.clamp(-1022, 1023) + 1023) << 52).view(torch.float64)  # (N,) 2^qe exactly
    mag = (n.to(torch.float64) * pow2).to(dtype)  # exact product, exact narrowing
    mag = torch.where(kind == _INF, float("inf"), mag)
    mag = torch.where(kind == _NAN, float("nan"), mag)  # the quiet NaN inf | 1 << (F - 1)
    sign_bit = sign.to(itype) << (W - 1)
    return (mag.view(itype) | sign_bit).view(dtype)


def _nearest_by_cast(x: torch.Tensor, fmt: Format, saturate: bool) -> torch.Tensor:
    """Round-to-nearest-even of float32 `x` through torch's cast to the format's dtype.

    The casts agree with the reference on every input that is neither NaN nor beyond the
    overflow threshold (checked bit for bit over the same patterns as the bit path). What
    differs is fixed here: NaN results become the reference's quiet NaN with the input's
    sign (casts drop the sign or the quiet payload), and torch's E4M3FN cast saturates
    where the reference gives NaN above 464 (the midpoint between 448 and the NaN code).
    One read-only pass (`aminmax`) decides whether a fix-up is needed at all.
    """
    src = x.clamp(-fmt.max, fmt.max) if saturate else x
    y = src.to(NATIVE_DTYPES[fmt]).to(torch.float32)
    # |x| above `limit` (or NaN) needs the fix-up; inf formats overflow to inf by the cast
    limit = float("inf")
    if not saturate and not fmt.has_infinity:
        limit = fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
    if x.numel() == 0:
        return y
    lo, hi = torch.aminmax(x)  # NaN propagates into both
    if bool((hi <= limit) & (lo >= -limit)):
        return y
    bad = ~(x.abs() <= limit)  # NaN, and beyond the threshold
    return quiet_nan_where(bad, x, y)


def check_tensor(x: Any, name: str = "x") -> torch.Tensor:
    """`x` if it is a tensor of float32, float64, bfloat16 or float16, else TypeError."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(
            f"{name} must be a torch.Tensor; got {type(x).__name__}. For NumPy arrays use "
            "normlab.precision.quantize."
        )
    if x.dtype not in _INPUT and x.dtype not in _WIDENED:
        raise TypeError(
            f"{name} must have dtype float32, float64, bfloat16 or float16; got "
            f"{x.dtype}. Convert it first, e.g. {name}.float()."
        )
    return x


def seed_from_rng(stochastic: bool, rng: Any, seed: Any, random_bits: Any,
                  x: torch.Tensor) -> Any:
    """`seed`, or the seed a NumPy Generator `rng` draws, as the NumPy twin draws it.

    With `rng`, the NumPy rules apply through
    [stochastic_source][normlab.precision.formats.random_bits.stochastic_source]: another
    source beside it is a ValueError, a non-Generator a TypeError, and one seed
    `rng.integers(0, 2**63)` is drawn in the stochastic mode only.
    """
    if rng is None:
        return seed
    drawn, _ = stochastic_source(stochastic, rng, seed, random_bits, tuple(x.shape))
    return drawn


def _check_randomness(
    mode: RoundingMode, seed: Any, random_bits: Any, t: torch.Tensor
) -> tuple[int | None, torch.Tensor | None]:
    """(seed, None) or (None, the (N,) int64 words) for stochastic rounding; (None, None)
    for the other modes.

    The rules of [normlab.precision.quantize][]: more than one source is an error in
    every mode, the stochastic mode needs one and the others refuse one, seed is an int in
    [0, 2^64).
    """
    given = [n for n, v in (("seed", seed), ("random_bits", random_bits)) if v is not None]
    if len(given) > 1 or (mode is RoundingMode.STOCHASTIC and not given):
        raise ValueError(
            "stochastic rounding needs exactly one source of randomness: seed= (an int in "
            "[0, 2**64)) or random_bits= (int64 words of x's shape); got "
            f"{given or 'none'}"
        )
    if mode is not RoundingMode.STOCHASTIC:
        if given:
            raise ValueError(
                f"{given[0]}= is used only by rounding='stochastic' (a deterministic mode "
                f"would ignore it); got {given[0]}= with rounding={mode.value!r}: drop it, or "
                "round stochastically"
            )
        return None, None
    if random_bits is not None:
        if not isinstance(random_bits, torch.Tensor) or random_bits.dtype not in (
            torch.int64, torch.uint64,
        ):
            raise TypeError(
                "random_bits must be a torch.Tensor of dtype int64 (the bits of uint64 "
                f"words); got {getattr(random_bits, 'dtype', type(random_bits).__name__)}"
            )
        if random_bits.shape != t.shape:
            raise ValueError(
                f"random_bits must have x's shape {tuple(t.shape)}; got "
                f"{tuple(random_bits.shape)}"
            )
        return None, random_bits.to(t.device).contiguous().view(torch.int64).reshape(-1)
    return check_seed(seed), None


def _stochastic(
    x: torch.Tensor, fmt: Format, saturate: bool, seed: int | None, words: torch.Tensor | None
) -> torch.Tensor:
    """Stochastic rounding of contiguous float32/float64 `x`: a fast exact kernel where
    `normlab.torch._stochastic.fast_kernel` has one, else the bit path; chunked on
    the CPU (words generated per chunk)."""
    fast = fast_kernel(fmt, saturate) if x.dtype == torch.float32 else None
    if fast is not None:
        return round_chunked(x, fast[0], seed, words, top_only=fast[1])
    mode = RoundingMode.STOCHASTIC

    def bit_path(part: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
        sign, n, qe, kind, _, s = _components(part, fmt, mode, w)
        nonzero = (s > 0) | (kind != _FINITE)
        return _assemble(*specials(torch, fmt, mode, saturate, sign, n, qe, kind, nonzero),
                         part.dtype)

    return round_chunked(x, bit_path, seed, words)


@renamed_arguments(t="x")
def quantize(
    x: Any,
    fmt: Any,
    *,
    rounding: RoundingMode | str = "nearest",
    saturate: bool = False,
    rng: np.random.Generator | None = None,
    seed: int | None = None,
    random_bits: torch.Tensor | None = None,
) -> torch.Tensor:
    """Round a tensor to the values of `fmt`; the result keeps x's dtype, shape and device.

    Formula: `q = (-1)^s * n * 2^qe` with `qe = max(floor(log2|x|), emin) - m` and n the
    rounded significand; every mode and special case as [normlab.precision.quantize][]
    (source: `normlab/precision/rounding.py`, `round_components`), bit for bit.

    Parameters
    ----------
    x : torch.Tensor
        Float32, float64, bfloat16 or float16, any shape and device.
    fmt : Format, str or torch.dtype
        A format, its name or a torch dtype (see [normlab.torch.get_format][]).
    rounding : str or RoundingMode, optional
        One of "nearest" (the default), "stochastic", "toward_zero", "nearest_away",
        "toward_positive", "toward_negative", or a `RoundingMode`.
    saturate : bool, optional
        Overflow and infinities become +-max instead of inf/NaN.
    rng : numpy.random.Generator, optional
        Stochastic mode: one seed `rng.integers(0, 2**63)` is drawn on the host, then used
        as `seed`, as the NumPy twin does (the same Generator state gives the same bits);
        the deterministic modes accept an `rng` without drawing from it.
    seed : int in [0, 2^64), optional
        Stochastic mode: element i of the flattened C-order tensor uses
        `splitmix64((seed + i) mod 2^64)`, as the NumPy side does, on every device.
    random_bits : Tensor of int64 with x's shape, optional
        Stochastic mode: explicit words (the bits of uint64 words; uint64 tensors are
        accepted too). The stochastic mode needs exactly one of `rng`, `seed` and
        `random_bits`; the deterministic modes refuse `seed` and `random_bits` (ValueError,
        as the NumPy twin); more than one is an error.

    Returns
    -------
    q : torch.Tensor
        The dtype, shape and device of `x`, detached (see
        [quantize_ste][normlab.torch.quantize_ste] for autograd).

    Raises
    ------
    TypeError
        x not a tensor of a supported dtype; rng not a Generator; seed not an int;
        random_bits not int64.
    ValueError
        Unknown format or mode; stochastic without randomness, or with both sources;
        seed outside [0, 2^64); random_bits of another shape.

    Notes
    -----
    bfloat16/float16 inputs are rounded in float32 (exact widening) and cast back, which
    is exact unless the format has values the input dtype lacks (then the cast rounds to
    nearest even a second time).

    Examples
    --------
    >>> quantize(torch.tensor([1.0 + 2**-8]), "bf16")
    tensor([1.])
    """
    x = check_tensor(x)
    fmt = get_format(fmt)
    mode = check_mode(rounding)
    if not isinstance(saturate, bool):
        raise TypeError(f"saturate must be a bool; got {saturate!r}")
    seed = seed_from_rng(mode is RoundingMode.STOCHASTIC, rng, seed, random_bits, x)
    seed, words = _check_randomness(mode, seed, random_bits, x)
    x = x.detach()
    if mode is RoundingMode.NEAREST and x.dtype != torch.float64 and use_chunks(x, fmt):
        return nearest_chunks(x, fmt, saturate)  # CPU, large enough: same bits, faster
    if x.dtype in _WIDENED:
        return quantize(x.float(), fmt, rounding=mode, saturate=saturate, seed=seed,
                        random_bits=None if words is None else words.reshape(x.shape),
                        ).to(x.dtype)
    if mode is RoundingMode.NEAREST and x.dtype == torch.float32 and fmt in NATIVE_DTYPES:
        if not torch.compiler.is_compiling():  # compiled: the fused bit path needs no checks
            return _nearest_by_cast(x, fmt, saturate)  # whole tensor (CUDA)
    x = x.contiguous()
    if mode is RoundingMode.STOCHASTIC:
        return _stochastic(x, fmt, saturate, seed, words).reshape(x.shape)
    sign, n, qe, kind, _, s = _components(x, fmt, mode, None)
    parts = specials(torch, fmt, mode, saturate, sign, n, qe, kind,
                     (s > 0) | (kind != _FINITE))
    return _assemble(*parts, x.dtype).reshape(x.shape)
