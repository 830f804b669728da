"""Software prefetch for the streaming kernels: cache lines requested before they are needed.

Dimension letters: N elements of a C-contiguous array, addressed in flat (C) order.

Why: a row kernel reads a row from memory, then works on it in L1 (statistics, then the
output). While it works, the hardware prefetcher sees no new misses and the memory bus
idles; the stores of the output then each wait for their line to be read for ownership.
Requesting the lines of the rows `ahead` elements further on, a few at a time between
blocks of the output sweep (read for the inputs, write for the outputs), keeps the bus busy
through the whole row. A prefetch never faults and never changes a value: results are
bit-identical with and without it.

Contract: [read_span][normlab.kernels.prefetch_jit.read_span] and
[write_span][normlab.kernels.prefetch_jit.write_span] take any C-contiguous array and a
flat element range, clamped to the array; [ahead_of][normlab.kernels.prefetch_jit.ahead_of]
is the policy (how far ahead, or 0: no prefetch for arrays that fit in a core's cache,
where the requests would only cost instructions).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = ["AHEAD_BYTES", "BLOCK_BYTES", "LINE_BYTES", "MIN_BYTES", "ahead_of", "read_span",
           "write_span"]

LINE_BYTES = 64
"""Bytes per cache line: one prefetch per line."""
BLOCK_BYTES = 1024
"""Bytes of output written between two bursts of prefetches (16 lines).

Small enough that a burst fits the core's outstanding-miss slots, large enough that the
block's loop still vectorises (measured on float32 rows: 1 KiB blocks cost 5-15% in L2
against one loop over the row; 64-byte blocks cost 2.4x).
"""
AHEAD_BYTES = 16384
"""How far ahead the lines are requested: one row of 4096 float32, four rows of 1024.

Far enough that a line arrives before its row is read (a row takes about a microsecond per
thread at memory speed), near enough that it is still in cache when it is.
"""
MIN_BYTES = 1 << 21
"""Arrays smaller than this (a core's 2 MiB L2) are not prefetched: they stay in cache."""


def _prefetch(write: int) -> Any:
    """An intrinsic `(a, i) -> None`: llvm.prefetch of the line holding flat element i of a."""

    def typer(typingctx: Any, a: Any, i: Any) -> Any:
        if not isinstance(a, types.Array) or a.layout != "C" or not isinstance(i, types.Integer):
            return None

        def codegen(context: Any, builder: Any, sig: Any, args: Any) -> Any:
            ary = context.make_array(sig.args[0])(context, builder, args[0])
            idx = context.cast(builder, args[1], sig.args[1], types.intp)
            i8p = ir.IntType(8).as_pointer()
            i32 = ir.IntType(32)
            fnty = ir.FunctionType(ir.VoidType(), [i8p, i32, i32, i32])
            fn = cgutils.get_or_insert_function(builder.module, fnty, "llvm.prefetch.p0")
            ptr = builder.bitcast(builder.gep(ary.data, [idx]), i8p)
            # (address, read 0 / write 1, locality 3: keep in all levels, data cache)
            builder.call(fn, [ptr, i32(write), i32(3), i32(1)])
            return context.get_dummy_value()

        return types.void(a, i), codegen

    return intrinsic(typer)


_prefetch_read = _prefetch(0)
_prefetch_write = _prefetch(1)


@njit(inline="always")
def read_span(a, lo, hi):
    """Prefetch for reading the lines of flat elements [lo, hi) of `a` (clamped to a)."""
    step = LINE_BYTES // a.itemsize
    for i in range(lo, min(hi, a.size), step):
        _prefetch_read(a, i)


@njit(inline="always")
def write_span(a, lo, hi):
    """Prefetch for writing (read for ownership) the lines of flat elements [lo, hi) of `a`."""
    step = LINE_BYTES // a.itemsize
    for i in range(lo, min(hi, a.size), step):
        _prefetch_write(a, i)


def ahead_of(a: np.ndarray) -> int:
    """Prefetch distance in elements for a kernel streaming over `a`, or 0 for none.

    Parameters
    ----------
    a : numpy.ndarray
        The kernel's input.

    Returns
    -------
    ahead : int
        `AHEAD_BYTES // a.itemsize` when `a` is larger than a core's L2 cache, else 0.
    """
    return AHEAD_BYTES // a.itemsize if a.nbytes >= MIN_BYTES else 0
