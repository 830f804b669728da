"""The training GEMMs' operand quantisation as PyTorch custom ops, opaque to compilers
(the products are in [normlab.torch.training._product_ops][]).

Dimension letters: M rows, K in_features, N out_features; R, C an operand's rows and columns.

Why custom ops (`torch.library.custom_op`, each with a fake implementation for tracing):
`torch.compile` sees each call as one opaque node with no graph break, and inductor cannot
rewrite what is inside. Inductor's default code generation computes float32 -> bfloat16
-> float32 cast pairs in float32 (the rounding vanishes), and it reduces a sum in its own
order (a bias gradient's bits change), so left to inductor the Bf16 recipe returns
unrounded products; inside an op, compiled runs execute the eager code and give eager's
bits. Each op is also where the path is chosen:

- CPU tensors of float32 or bfloat16 whose rows or columns are contiguous: a zero-copy
  NumPy view (bfloat16 as its 16-bit patterns) through [normlab.precision.operands.operand][],
  which runs the numba operand kernels (one pass per operand, no float32 copy of a
  bfloat16 input, blocks read where they lie; a forward operand of the Bf16 and FP8
  recipes and its saved codes in one pass, `fake_encode`; per-tensor amaxes in one
  read-only pass, `tensor_amax`);
- anything else (other devices, other dtypes or layouts, `NORMLAB_BACKEND=numpy`, no
  numba): the same functions on tensors (torch ops, the recipes' shared arithmetic).

Both give the same bits (the differential suite checks every operand both ways). Layouts
(`order_of`) depend on the input and the device, never on the path: values and codes are
stored as the input lies (the Hadamard transform's output rows first), except 1-D MX and
NVFP4 blocks along axis 0 off the CPU, columns first as their torch path computes them.
The layout is an argument of each op, so a compiled graph records it.

Stochastic rounding (NVFP4 gradients) draws from streams numbered by the layer's step
counter ([next_step][normlab.torch.training._product_ops.next_step]); the seed of each rounding
is computed inside the op from the counter's value.
"""

from __future__ import annotations

import contextlib
from typing import Any

import ml_dtypes
import numpy as np
import torch

from normlab import _backend
from normlab.precision.operands import operand as po
from normlab.precision.operands.codes import stores_codes
from normlab.precision.operands.one_pass import fake_encode_operand
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled.hadamard import rht_apply
from normlab.precision.scaled.namespace import NUMPY
from normlab.precision.scaled.quantizers import Quantizer
from normlab.torch._stochastic import splitmix64_int
from normlab.torch.namespace import TORCH

__all__ = [
    "decode",
    "encode",
    "fake",
    "fake_encode",
    "hadamard_rows",
    "kernel_threads",
    "numpy_view",
    "operand_order",
    "order_of",
    "stream_seed",
    "tensor_amax",
]

_EMPTY = (0,)


def stream_seed(stream: int, counter: int, which: int) -> int:
    """A 63-bit seed for one stochastic rounding: `splitmix64(stream * 2^32 + 2 counter +
    which) >> 1`, so distinct (layer, step, GEMM) streams start far apart."""
    word = (int(stream) * 2**32 + 2 * int(counter) + int(which)) % 2**64
    return splitmix64_int(word) >> 1  # Python ints: exact, unlike NumPy's uint64


def order_of(q: Quantizer, rows_contiguous: bool, device: Any) -> str:
    """The layout ("C" or "F") of an operand's values and codes: the input's, except for 1-D
    MX and NVFP4 blocks along axis 0 off the CPU, columns first (their torch path computes
    along the moved axis; on the CPU the kernels write rows as they read them, and a
    transposed write of every element costs more than the rounding)."""
    off_cpu = torch.device(device).type != "cpu"
    rows, cols = q.block
    if off_cpu and q.columns_first_off_cpu and rows > 1 and cols == 1:
        return "F"
    return "C" if rows_contiguous else "F"


def _own(out: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
    """`out`, copied if it shares memory with the op's input `source` (a quantizer that
    leaves values as they are, such as float32 rounding of float32: a custom op's result
    may not alias its inputs)."""
    if out.numel() and out.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
        return out.clone()
    return out


def _rows_contiguous(t: torch.Tensor) -> bool:
    return t.dim() != 2 or t.stride(1) == 1 or t.shape[1] == 1


def _empty_2d(shape: tuple[Any, Any], order: str, dtype: torch.dtype,
              device: Any) -> torch.Tensor:
    r, c = shape
    if order == "F":
        return torch.empty((c, r), dtype=dtype, device=device).t()
    return torch.empty((r, c), dtype=dtype, device=device)


class _Memory:
    """A tensor's memory as NumPy sees it (`__array_interface__`), the tensor kept alive.

    Not `Tensor.numpy()`: that marks the tensor's storage as not resizable, and FSDP2
    frees an unsharded parameter by resizing its storage to 0 after the forward.
    """

    def __init__(self, t: torch.Tensor, typestr: str) -> None:
        self.tensor = t
        size = t.element_size()
        self.__array_interface__ = {
            "shape": tuple(t.shape), "strides": tuple(size * s for s in t.stride()),
            "typestr": typestr, "data": (t.data_ptr(), True), "version": 3}


def numpy_view(t: torch.Tensor) -> np.ndarray | None:
    """A zero-copy, read-only NumPy view of a 2-D CPU float32 or bfloat16 tensor whose rows
    or columns are contiguous (bfloat16 as ml_dtypes' bfloat16), or None."""
    if t.device.type != "cpu" or t.dim() != 2 or t.dtype not in (torch.float32,
                                                                 torch.bfloat16):
        return None
    if not (t.is_contiguous() or t.t().is_contiguous()) or t.numel() == 0:
        return None
    if t.dtype == torch.float32:
        return np.asarray(_Memory(t.detach(), "<f4"))
    return np.asarray(_Memory(t.detach(), "<i2")).view(ml_dtypes.bfloat16)


def _fast(name: str) -> bool:
    """Whether the numba kernel `name` is there to serve CPU views."""
    return _backend.kernel(name) is not None


def kernel_threads() -> contextlib.AbstractContextManager[Any]:
    """The kernels' thread budget: serial where torch runs on one thread (a parallel
    region would wake numba's workers, which then compete with torch's next ops)."""
    if torch.get_num_threads() > 1:
        return contextlib.nullcontext()
    from normlab.kernels._adapt import serial  # numba is there: `_fast` said so

    return serial()


def hadamard_rows(t: torch.Tensor, matrix: torch.Tensor) -> torch.Tensor:
    """The random Hadamard transform along rows (axis 0) in blocks of 16, M zero-padded to a
    multiple of 16: `random_hadamard_transform(pad(t), 16, seed, axis=0)` for the `matrix`
    of that seed ([rht_matrix][normlab.precision.scaled.hadamard.rht_matrix]), in float32.

    The map is orthogonal, so for two operands transformed alike `(H dy)^T (H x) = dy^T x`.
    """
    pad = (-t.shape[0]) % 16
    work = t.to(torch.float32)
    padded = torch.nn.functional.pad(work, (0, 0, 0, pad)) if pad else work
    # the matrix's entries are +-1/4, exact in every float dtype a module cast may give it
    out = rht_apply(padded, matrix.to(torch.float32), 0, xp=TORCH)  # M',C
    return out.contiguous()  # rows first: the layout the ops' fake shapes assume


def _prepared(t: torch.Tensor, hadamard: torch.Tensor | None) -> torch.Tensor:
    """`t`, through `hadamard_rows` when a matrix is given (NVFP4's wgrad operands)."""
    return t if hadamard is None else hadamard_rows(t, hadamard)


@torch.library.custom_op("normlab::fake_operand", mutates_args=())
def _fake_op(t: torch.Tensor, spec: str, scale: torch.Tensor | None, step: torch.Tensor | None,
             stream: int, which: int, hadamard: torch.Tensor | None,
             order: str) -> torch.Tensor:
    s = Quantizer.from_key(spec)
    src = _prepared(t, hadamard)
    seed = None if step is None else stream_seed(stream, int(step), which)
    view = numpy_view(src) if _fast("fake_operand") else None
    if view is not None:
        sc = None if scale is None else np.float32(scale.detach().cpu().item())
        with kernel_threads():
            out = torch.from_numpy(po.fake_operand(view, s, scale=sc, seed=seed, order=order,
                                                   xp=NUMPY))
    else:
        out = po.fake_operand(src.detach(), s, scale=scale, seed=seed, order=order, xp=TORCH)
    return _own(TORCH.ordered(out, order), t)


def _prepared_shape(t: torch.Tensor, hadamard: torch.Tensor | None) -> tuple[Any, Any]:
    r, c = t.shape
    return (r + (-r) % 16, c) if hadamard is not None else (r, c)


@_fake_op.register_fake
def _(t, spec, scale, step, stream, which, hadamard, order):
    return _empty_2d(_prepared_shape(t, hadamard), order, torch.float32, t.device)


def operand_order(q: Quantizer, t: torch.Tensor,
                  hadamard: torch.Tensor | None = None) -> str:
    """The layout of `t`'s values and codes, an argument of each op: the real and fake
    implementations follow it, and a compiled graph records it in its cache key."""
    return order_of(q, hadamard is not None or _rows_contiguous(t), t.device)


def fake(t: torch.Tensor, q: Quantizer, *, scale: torch.Tensor | None = None,
         step: torch.Tensor | None = None, stream: int = 0, which: int = 0,
         hadamard: torch.Tensor | None = None) -> torch.Tensor:
    """The float32 values operand `t` (2-D, any float dtype) contributes to its GEMM.

    Parameters
    ----------
    t : torch.Tensor
        The operand, shape (R, C).
    q : Quantizer
        How it is quantised.
    scale : torch.Tensor or None, optional
        The 0-d float32 scale of a quantizer that `takes_scale`.
    step : torch.Tensor or None, optional
        A 0-d int64 CPU tensor: round stochastically with the stream of
        `stream_seed(stream, step, which)` (NVFP4 gradients); None: to nearest.
    stream : int, optional
        The layer's stream number.
    which : int, optional
        Which of the layer's two gradient roundings (0: dgrad, 1: wgrad).
    hadamard : torch.Tensor or None, optional
        A 16 x 16 float32 matrix: transform the rows in blocks of 16 first (R padded).

    Returns
    -------
    out : torch.Tensor
        float32, shape (R, C) (R padded with `hadamard`), in the layout of `order_of`.
    """
    return _fake_op(t, q.key(), scale, step if q.stochastic else None, int(stream),
                    int(which), hadamard, operand_order(q, t, hadamard))


_DTYPES = {"uint8": torch.uint8, "float32": torch.float32}


def _encoded_shapes(s: Quantizer, shape: tuple[Any, Any],
                    order: str) -> tuple[tuple[Any, ...], torch.dtype, tuple[Any, ...],
                                         torch.dtype, tuple[Any, ...]]:
    """(codes shape, codes dtype, scales shape, scales dtype, tensor-scale shape)."""
    r, c = shape
    stored = (c, r) if order == "F" else (r, c)
    if not stores_codes(s.fmt):
        code_shape, code_dtype = stored, torch.float32
    else:
        code_dtype = torch.uint8 if s.fmt.bits <= 8 else torch.int16
        code_shape = (stored[0], (stored[1] + 1) // 2) if s.packed else stored
    grid, grid_dtype = s.scale_grid((r, c))
    return code_shape, code_dtype, grid, _DTYPES[grid_dtype], s.tensor_scale_shape()


def _tensor(a: Any) -> torch.Tensor:
    """A kernel's result as a tensor sharing its memory (a copy only where it is not a
    writable C-contiguous array; 0-d stays 0-d)."""
    arr = np.asarray(a)
    if not (arr.flags.c_contiguous and arr.flags.writeable):
        arr = arr.copy(order="C")
    return torch.from_numpy(arr)


@torch.library.custom_op("normlab::encode_operand", mutates_args=())
def _encode_op(t: torch.Tensor, spec: str, scale: torch.Tensor | None,
               hadamard: torch.Tensor | None,
               order: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    s = Quantizer.from_key(spec)
    src = _prepared(t, hadamard)
    view = numpy_view(src) if _fast("encode_operand") else None
    if view is not None:
        sc = None if scale is None else np.float32(scale.detach().cpu().item())
        with kernel_threads():
            enc = po.encode_operand(view, s, scale=sc, order=order, xp=NUMPY)
        parts = [None if p is None else _tensor(p)
                 for p in (enc.codes, enc.scales, enc.tensor_scale)]
    else:
        enc = po.encode_operand(src.detach(), s, scale=scale, order=order, xp=TORCH)
        parts = [enc.codes, enc.scales, enc.tensor_scale]
    return tuple(_own(p, t) for p in _parts(parts, t.device))  # type: ignore[return-value]


def _parts(parts: Any, device: Any) -> tuple[torch.Tensor, ...]:
    """(codes, scales, tensor scale) as contiguous tensors on `device`, an empty float32
    tensor where the kind has none."""
    return tuple(torch.empty(_EMPTY, dtype=torch.float32, device=device) if p is None
                 else p.contiguous().to(device) for p in parts)


@_encode_op.register_fake
def _(t, spec, scale, hadamard, order):
    s = Quantizer.from_key(spec)
    shape = _prepared_shape(t, hadamard)
    cs, cd, ss, sd, ts = _encoded_shapes(s, shape, order)
    return (t.new_empty(cs, dtype=cd), t.new_empty(ss, dtype=sd),
            t.new_empty(ts, dtype=torch.float32))


def encode(t: torch.Tensor, q: Quantizer, *, scale: torch.Tensor | None = None,
           hadamard: torch.Tensor | None = None) -> tuple[torch.Tensor, ...]:
    """Operand `t` as (codes, scales, tensor scale) tensors (empty where the quantizer
    stores none): [encode_operand][normlab.precision.operands.operand.encode_operand] in its fixed
    layout."""
    return _encode_op(t, q.key(), scale, hadamard, operand_order(q, t, hadamard))


@torch.library.custom_op("normlab::fake_encode_operand", mutates_args=())
def _fake_encode_op(t: torch.Tensor, spec: str, scale: torch.Tensor | None, order: str
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    s = Quantizer.from_key(spec)
    view = numpy_view(t) if _fast("fake_encode_operand") else None
    if view is not None:
        sc = None if scale is None else np.float32(scale.detach().cpu().item())
        with kernel_threads():
            vals, enc = fake_encode_operand(view, s, scale=sc, order=order, xp=NUMPY)
        values = torch.from_numpy(np.asarray(vals))
        parts = [None if p is None else _tensor(p)
                 for p in (enc.codes, enc.scales, enc.tensor_scale)]
    else:
        values, enc = fake_encode_operand(t.detach(), s, scale=scale, order=order, xp=TORCH)
        parts = [enc.codes, enc.scales, enc.tensor_scale]
    values = TORCH.ordered(values, order).to(t.device)
    return (values, *_parts(parts, t.device))


@_fake_encode_op.register_fake
def _(t, spec, scale, order):
    s = Quantizer.from_key(spec)
    cs, cd, ss, sd, ts = _encoded_shapes(s, tuple(t.shape), order)
    return (_empty_2d(tuple(t.shape), order, torch.float32, t.device),
            t.new_empty(cs, dtype=cd), t.new_empty(ss, dtype=sd),
            t.new_empty(ts, dtype=torch.float32))


def fake_encode(t: torch.Tensor, q: Quantizer, *, scale: torch.Tensor | None = None
                ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """`(fake(t, q), encode(t, q))` from one pass over `t` where the quantizer allows
    ([fake_encode_operand][normlab.precision.operands.one_pass.fake_encode_operand]): a forward
    operand whose values do not depend on the axis and its saved codes, both laid out as
    `t`."""
    values, *parts = _fake_encode_op(t, q.key(), scale, operand_order(q, t))
    return values, tuple(parts)


@torch.library.custom_op("normlab::decode_operand", mutates_args=())
def _decode_op(codes: torch.Tensor, scales: torch.Tensor, tensor_scale: torch.Tensor,
               spec: str, rows: int, cols: int, order: str) -> torch.Tensor:
    s = Quantizer.from_key(spec)
    enc = s.encoded(codes, scales, tensor_scale)  # None where the quantizer stores none
    if codes.device.type == "cpu" and _fast("decode_operand"):
        enc = s.encoded(*(None if p is None else p.numpy()
                          for p in (enc.codes, enc.scales, enc.tensor_scale)))
        with kernel_threads():
            out = torch.from_numpy(po.decode_operand(enc, s, (rows, cols), order=order,
                                                     xp=NUMPY))
    else:
        out = po.decode_operand(enc, s, (rows, cols), order=order, xp=TORCH)
    return _own(TORCH.ordered(out, order), codes)


@_decode_op.register_fake
def _(codes, scales, tensor_scale, spec, rows, cols, order):
    return _empty_2d((rows, cols), order, torch.float32, codes.device)


def decode(parts: tuple[torch.Tensor, ...], q: Quantizer, shape: tuple[int, int],
           order: str) -> torch.Tensor:
    """The float32 operand that `encode` kept: the values `fake` gives, bit for bit."""
    return _decode_op(*parts, q.key(), int(shape[0]), int(shape[1]), order)


@torch.library.custom_op("normlab::tensor_amax", mutates_args=())
def _amax_op(t: torch.Tensor) -> torch.Tensor:
    view = numpy_view(t) if _fast("tensor_amax") else None
    if view is not None:
        with kernel_threads():
            return torch.tensor(float(core.tensor_amax(view, xp=NUMPY)), dtype=torch.float32)
    return core.tensor_amax(t.detach(), xp=TORCH).clone()


@_amax_op.register_fake
def _(t):
    work = torch.float64 if t.dtype == torch.float64 else torch.float32
    return t.new_empty((), dtype=work)


def tensor_amax(t: torch.Tensor) -> torch.Tensor:
    """max |t| as a 0-d tensor of t's work dtype (float32; float64 for float64 `t`), NaN
    if `t` holds one: [tensor_amax][normlab.precision.scaled.arithmetic.tensor_amax]; CPU
    float32/bfloat16 operands go to its kernel through a zero-copy view (no float32 copy,
    no |t| temporary)."""
    return _amax_op(t)
