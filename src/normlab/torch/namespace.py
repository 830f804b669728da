"""The torch array namespace: recipe arithmetic of `normlab.precision` on tensors.

[normlab.precision.scaled.namespace][] explains the contract: each method is a tensor operation
on the input's device, with no host synchronisation and no Python branching on values,
so the shared recipe functions trace under `torch.compile` (inductor and `aot_eager`) as
one graph and run on CUDA tensors as they do on the CPU. Importing this module registers
[TORCH][normlab.torch.namespace.TORCH] for `torch.Tensor`.

The rounding engine is normlab's exact one for tensors: `round_elements` (native casts
and float32 arithmetic for round-to-nearest into bf16, fp16, E4M3, E5M2 and E2M1) and
[normlab.torch.quantize][] otherwise, bit-identical to the NumPy reference.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from normlab.precision.scaled.namespace import F32_MAX, ArrayNamespace, register_namespace
from normlab.torch._fastround import round_elements
from normlab.torch._import import torch
from normlab.torch.quantize import quantize

__all__ = ["TORCH", "TorchNamespace"]


class TorchNamespace(ArrayNamespace):
    """[ArrayNamespace][normlab.precision.scaled.namespace.ArrayNamespace] on torch tensors.

    Attributes
    ----------
    name : str
        `"torch"`.
    lib : module
        `torch`.
    """

    name = "torch"
    lib = torch
    _DTYPES: ClassVar[dict[str, Any]] = {
        "float32": torch.float32, "float64": torch.float64, "int16": torch.int16,
        "int32": torch.int32, "int64": torch.int64, "uint8": torch.uint8, "bool": torch.bool}

    def astype(self, x: Any, dtype: str) -> Any:
        return x.to(self._DTYPES[dtype])

    def cast_like(self, x: Any, like: Any) -> Any:
        return x.to(like.dtype)

    def work(self, x: Any) -> Any:
        return x if x.dtype in (torch.float32, torch.float64) else _widen(x)

    def scalar(self, value: float, like: Any, dtype: str | None = None) -> Any:
        dt = like.dtype if dtype is None else self._DTYPES[dtype]
        if dt == torch.float32:  # through float64: a value beyond float32 rounds to inf
            wide = torch.full((), value, dtype=torch.float64, device=like.device)
            return wide.to(torch.float32)
        return torch.full((), value, dtype=dt, device=like.device)  # a fill, no host copy

    def full(self, shape: Sequence[int], value: float, like: Any,
             dtype: str | None = None) -> Any:
        dt = like.dtype if dtype is None else self._DTYPES[dtype]
        return torch.full(tuple(shape), value, dtype=dt, device=like.device)

    def arange(self, n: int, like: Any) -> Any:
        return torch.arange(n, dtype=torch.int64, device=like.device)

    def input_max(self, x: Any) -> float:
        if x.dtype in (torch.bfloat16, torch.float16):
            return float(torch.finfo(x.dtype).max)
        return F32_MAX

    def is_float64(self, x: Any) -> bool:
        return bool(x.dtype == torch.float64)

    def take(self, x: Any, indices: Any, axis: int) -> Any:
        return torch.index_select(x, axis, indices)

    def pad_end(self, x: Any, widths: Sequence[int]) -> Any:
        if not any(widths):
            return x
        pads: list[int] = []
        for w in reversed(widths):  # torch's pad lists the last axis first
            pads += [0, int(w)]
        return torch.nn.functional.pad(x, pads)

    def constant(self, table: Any, like: Any) -> Any:
        return torch.from_numpy(table).to(like.device)

    def searchsorted(self, sorted_values: Any, x: Any) -> Any:
        return torch.searchsorted(sorted_values, x.contiguous())

    def ordered(self, x: Any, order: str) -> Any:
        return x.t().contiguous().t() if order == "F" else x.contiguous()

    def quantize(self, x: Any, fmt: Any, *, saturate: bool, rounding: str = "nearest",
                 seed: int | None = None, random_bits: Any = None) -> Any:
        if rounding == "nearest" and random_bits is None and x.dtype == torch.float32:
            return round_elements(x, fmt, saturate=saturate)  # the same bits, faster
        return quantize(x, fmt, rounding=rounding, saturate=saturate, seed=seed,
                        random_bits=random_bits)

    def dispatch(self, name: str, reference: Callable[..., Any], *args: Any) -> Any:
        return reference(*args)

    def quiet(self) -> contextlib.AbstractContextManager[Any]:
        return contextlib.nullcontext()  # tensors never warn on inf or NaN


@torch.library.custom_op("normlab::widen", mutates_args=())
def _widen(x: torch.Tensor) -> torch.Tensor:
    """`x` (a 16-bit float) as float32, exactly.

    An op opaque to `torch.compile`: inductor computes a bfloat16 intermediate in float32
    when it fuses its producer with a consumer, so a widening cast left to it could hand
    the recipe arithmetic (an amax, say) values the stored bfloat16 tensor does not hold.
    """
    return x.to(torch.float32)


@_widen.register_fake
def _(x):
    return torch.empty_like(x, dtype=torch.float32)


TORCH = TorchNamespace()
"""The torch namespace (registered for `torch.Tensor`)."""

register_namespace(torch.Tensor, TORCH)
