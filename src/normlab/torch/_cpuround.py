"""Round-to-nearest-even of CPU tensors into bf16, fp16, E4M3FN and E5M2, chunk by chunk.

Dimension letters: N elements (the flattened C-order input), K elements of one chunk.

Contract: bit-identical to [normlab.precision.quantize][] (`rounding="nearest"`) for
float32 inputs, and to its float32 result cast back for bfloat16/float16 inputs, exactly as
[normlab.torch.quantize][] defines them; the result never depends on the chunk size or
the number of threads (every element is rounded on its own).

Why chunks: on a large tensor the whole-tensor casts make several full-size temporaries
(the narrow intermediate, the float32 result, the NaN/overflow check), and every fresh
allocation costs page faults. Here the output is the only full-size allocation (asking the
kernel for huge pages where it can, as NumPy does for its arrays); the intermediates are
scratch buffers of one chunk (`_CHUNK` elements, 8 MiB of float32) that are reused for
every chunk and stay in the caches, and the NaN/overflow check reads each chunk while it
is still cached. Each torch op on a chunk runs on torch's intra-op threads; the chunk is
large enough that their start-up cost (one parallel region per op and chunk) stays small
next to the work on an otherwise idle machine. Where other processes keep the cores busy,
each region waits for a core, and the loop's regions would cost far more than the work:
a probe (one tiny parallel op) detects that, and the whole tensor is then one chunk (the
same ops, a handful of regions, full-size scratch that also asks for huge pages).

How each format rounds a float32 chunk:

- bf16, fp16, E5M2: torch's casts to the format's dtype and back, which round to nearest
  even like the reference for every input but NaN (overflow goes to inf in both).
- E4M3FN: arithmetic instead of torch's fp8 -> float32 cast, which is slow on CPU. With
  `e = clamp(floor(log2|x|), emin, emax + 1)` (m = 3, emin = -6, emax = 8) and
  `c = 1.5 * 2^(e + 23 - m)`, `x + c` lies in `[2^(e + 23 - m), 2^(e + 24 - m))`
  for every `|x| < 2^(e + 1)` of either sign, where float32's spacing is `2^(e - m)`,
  the format's quantum at x; the float32 addition rounds there to nearest, ties to even
  (c is an even multiple of the quantum, so the parities agree), and `(x + c) - c` is
  exact. The sign is copied back (a negative x that rounds to zero gives -0).
  `2^floor(log2|x|)` is x's bits with the sign and mantissa masked off (0 for zeros and
  subnormals, which the clamp lifts to `2^emin`; float32 subnormals lie below half the
  quantum, so they round to +-0 even where the CPU flushes them); inputs from 2^10 on (all
  beyond the overflow threshold 464) and NaN take the fix-up below.

Fix-up, per chunk and only when the chunk holds one: NaN becomes the reference's quiet
NaN with the input's sign (casts and additions keep payloads), and without `saturate`
E4M3FN values beyond 464 (the midpoint between 448 and the NaN code) become NaN. With
`saturate` the input is clamped to +-max first (NaN stays NaN).
"""

from __future__ import annotations

import ctypes
import sys
import time
from collections.abc import Callable

import torch

from normlab.precision.formats.format import FLOAT8_E4M3FN, Format
from normlab.torch.formats import NATIVE_DTYPES, quiet_nan_where

__all__ = ["chunked_formats", "nearest_chunks", "use_chunks"]

_CHUNK = 1 << 21  # elements: 8 MiB of float32 per buffer, split between the threads
# below these sizes the whole-tensor casts cost less per call (E4M3FN's slow fp8 -> float32
# cast makes the arithmetic route pay off early; the others gain from about 4 MiB on)
_MIN_E4M3 = 1 << 12
_MIN_CASTS = 1 << 20
_HUGE_BYTES = 1 << 22  # outputs from 4 MiB on ask for huge pages (NumPy's threshold)
_HUGE_PAGE = 1 << 21
_MADV_HUGEPAGE = 14  # Linux <sys/mman.h>
_CASTS = {f: d for f, d in NATIVE_DTYPES.items() if f != FLOAT8_E4M3FN}  # E4M3FN: arithmetic
_EXP_MASK = 0x7F800000
_madvise: list[Callable[[int, int, int], int] | None] = []
_PROBE_ELEMENTS = 1 << 16  # twice torch's grain size: one parallel region on two threads
_PROBE_S = 1e-3  # an idle machine starts such a region in microseconds
_probe: list[torch.Tensor] = []


def chunked_formats() -> tuple[Format, ...]:
    """The formats `nearest_chunks` handles.

    Returns
    -------
    formats : tuple of Format
        bfloat16, float16, float8_e5m2 and float8_e4m3fn.

    Examples
    --------
    >>> [f.name for f in chunked_formats()]
    ['bfloat16', 'float16', 'float8_e5m2', 'float8_e4m3fn']
    """
    return (*_CASTS, FLOAT8_E4M3FN)


def use_chunks(x: torch.Tensor, fmt: Format) -> bool:
    """Whether `nearest_chunks` is the faster route for `x` and `fmt`: an eager
    CPU tensor, not tracking gradients, of at least `_MIN_E4M3` (E4M3FN) or
    `_MIN_CASTS` (the others) elements. CUDA and `torch.compile` keep whole-tensor ops
    (no Python loop there).

    Parameters
    ----------
    x : torch.Tensor
        The tensor to round.
    fmt : Format
        The format it is rounded to.

    Returns
    -------
    chunked : bool
        Whether to chunk; False for formats that are not `chunked_formats`.

    Examples
    --------
    >>> from normlab.precision import get_format
    >>> use_chunks(torch.zeros(8), get_format("e4m3"))
    False
    >>> use_chunks(torch.zeros(64, 512), get_format("e4m3"))
    True
    """
    least = _MIN_E4M3 if fmt == FLOAT8_E4M3FN else _MIN_CASTS
    return (fmt in chunked_formats() and x.device.type == "cpu" and x.numel() >= least
            and not torch.compiler.is_compiling()
            and not (x.requires_grad and torch.is_grad_enabled()))


def _threads_waiting() -> bool:
    """Whether torch's intra-op threads are slow to start: one tiny parallel op (a fill of
    `_PROBE_ELEMENTS`) takes longer than `_PROBE_S`, as when other processes keep the
    cores busy. Then `nearest_chunks` takes the whole tensor as one chunk (a handful
    of parallel regions instead of one per op and chunk). Only the speed depends on it."""
    if torch.get_num_threads() < 2:
        return False
    if not _probe:
        _probe.append(torch.empty(_PROBE_ELEMENTS))
    t0 = time.perf_counter()
    _probe[0].fill_(0.0)
    return time.perf_counter() - t0 > _PROBE_S


def _libc_madvise() -> Callable[[int, int, int], int] | None:
    """libc's `madvise` on Linux (looked up once), else None."""
    if not _madvise:
        fn = None
        if sys.platform.startswith("linux"):
            try:
                fn = ctypes.CDLL(None, use_errno=True).madvise
                fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
                fn.restype = ctypes.c_int
            except (OSError, AttributeError):
                fn = None
        _madvise.append(fn)
    return _madvise[0]


def _empty(n: int, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised (n,) CPU tensor; from 4 MiB on its whole 2 MiB pages are advised
    as huge pages before anything touches them (fewer page faults on the first write).
    An ordinary torch tensor: the advice only concerns how the kernel backs the memory."""
    out = torch.empty(n, dtype=dtype)
    nbytes = n * out.element_size()
    madvise = _libc_madvise() if nbytes >= _HUGE_BYTES else None
    if madvise is not None:
        start = (out.data_ptr() + _HUGE_PAGE - 1) & ~(_HUGE_PAGE - 1)
        end = (out.data_ptr() + nbytes) & ~(_HUGE_PAGE - 1)
        if end > start:
            madvise(start, end - start, _MADV_HUGEPAGE)  # advice only: failure is harmless
    return out


class _Scratch:
    """The reused (K,) buffers of one call."""

    def __init__(self, k: int, fmt: Format, widened: bool, saturate: bool) -> None:
        def f32() -> torch.Tensor:
            return _empty(k, torch.float32)

        self.load = f32() if widened else None  # the chunk widened to float32
        self.stage = f32() if widened else None  # the float32 result before narrowing
        self.clamped = f32() if saturate else None
        native = _CASTS.get(fmt)
        self.narrow = None if native is None else _empty(k, native)
        self.c = f32() if native is None else None  # E4M3FN: (x + c) - c


def _round_cast(src: torch.Tensor, dst: torch.Tensor, narrow: torch.Tensor) -> None:
    """dst = src cast to the narrow dtype and back (both casts in place)."""
    narrow.copy_(src)
    dst.copy_(narrow)


def _round_e4m3(src: torch.Tensor, dst: torch.Tensor, c: torch.Tensor, fmt: Format) -> None:
    """dst = E4M3FN rounding of src by `(x + c) - c` (module docstring); `c` is scratch.
    Exact for |src| < 2^(emax + 2) = 2^10; larger and NaN inputs are fixed up by the caller."""
    bits = c.view(torch.int32)
    torch.bitwise_and(src.view(torch.int32), _EXP_MASK, out=bits)  # 2^floor(log2|x|)
    bits.clamp_((127 + fmt.emin) << 23, (128 + fmt.emax) << 23)  # 2^e, e clamped
    scale = 1.5 * 2.0 ** (23 - fmt.mantissa_bits)  # c = scale * 2^e, exact
    torch.add(src, c, alpha=scale, out=dst)  # one rounding, to the quantum 2^(e - m)
    dst.sub_(c, alpha=scale)  # exact
    torch.copysign(dst, src, out=dst)  # a negative x that rounds to 0 gives -0


def _fix(x: torch.Tensor, dst: torch.Tensor, limit: float) -> None:
    """Where x is NaN or |x| > limit, dst becomes the quiet NaN with x's sign."""
    lo, hi = torch.aminmax(x)  # NaN propagates into both
    if float(hi) <= limit and float(lo) >= -limit:
        return
    dst.copy_(quiet_nan_where(~(x.abs() <= limit), x, dst))


def _limit(fmt: Format, saturate: bool) -> float:
    """|x| above which (or NaN) the fix-up applies; the inf formats overflow by the cast."""
    if not saturate and not fmt.has_infinity:
        return fmt.max + 2.0 ** (fmt.emax - fmt.mantissa_bits - 1)
    return float("inf")


def nearest_chunks(x: torch.Tensor, fmt: Format, saturate: bool) -> torch.Tensor:
    """Round CPU tensor `x` to nearest-even `fmt` (one of `chunked_formats`).

    Parameters
    ----------
    x : torch.Tensor
        Float32, bfloat16 or float16 on the CPU, any shape and strides, not requiring grad
        (the caller detaches).
    fmt : Format
        One of `chunked_formats`.
    saturate : bool
        Overflow and infinities become +-max instead of inf/NaN.

    Returns
    -------
    q : torch.Tensor
        A new contiguous tensor of x's dtype and shape: bfloat16/float16 inputs are
        rounded in float32 and cast back to nearest even, as [normlab.torch.quantize][]
        does.

    Raises
    ------
    KeyError
        fmt not one of `chunked_formats` (callers check first).

    Examples
    --------
    >>> from normlab.precision import get_format
    >>> nearest_chunks(torch.tensor([1.0 + 2**-4, 465.0]), get_format("e4m3"), False)
    tensor([1., nan])
    """
    if fmt not in chunked_formats():
        names = [f.name for f in chunked_formats()]
        raise KeyError(f"fmt {fmt.name!r} is not one of the chunked formats {names}")
    n = x.numel()
    flat = x.reshape(-1)  # N; a copy only if x is not contiguous
    out = _empty(n, x.dtype)  # N
    if n == 0:
        return out.view(x.shape)
    k = n if n <= _CHUNK or _threads_waiting() else _CHUNK  # one chunk: no probe needed
    widened = x.dtype != torch.float32
    s = _Scratch(k, fmt, widened, saturate)
    limit = _limit(fmt, saturate)
    for i in range(0, n, k):
        xc = flat[i:i + k]  # K
        j = xc.numel()
        if s.load is not None:
            xc = s.load[:j].copy_(xc)  # exact widening
        src = xc if s.clamped is None else torch.clamp(xc, -fmt.max, fmt.max,
                                                       out=s.clamped[:j])
        dst = out[i:i + j] if s.stage is None else s.stage[:j]
        if s.narrow is not None:
            _round_cast(src, dst, s.narrow[:j])
        else:
            assert s.c is not None
            _round_e4m3(src, dst, s.c[:j], fmt)
        _fix(xc, dst, limit)
        if s.stage is not None:
            out[i:i + j].copy_(dst)  # round to nearest even into the input dtype
    return out.view(x.shape)
