"""The inspector's hooks: which layers it watches and how it copies their three GEMM operands.

Contract: [Watch][normlab.torch.numerics._hooks.Watch] registers, on every selected
layer, one forward hook (the input and the weight), which registers on the layer's output
one tensor hook (the output gradient), and removes them again. The inspector installs the
forward hooks for the steps it records only (the log knows at each `step()` whether the
next one is), so a step that is not recorded runs without them: no hook call per layer and
no tensor hook in its autograd graph. The hooks read the tensors and return None: they
change no value, no gradient and no random state, so the model computes exactly what it
computes without them.

Operands enter as the GEMMs see them: the input flattened to (M, K), the weight as (N, K)
(Hugging Face's `Conv1D` stores it as (K, N)), the output gradient as (M, N).
"""

from __future__ import annotations

import fnmatch
from collections.abc import Callable, Iterable
from typing import Any

import torch

from normlab.torch.numerics._log import InspectLog
from normlab.torch.numerics._quantizers import OperandQuantizer, operand_quantizer
from normlab.torch.numerics._stats import raw_stats
from normlab.torch.training._plan import hf_conv1d_class
from normlab.torch.training.linear import QuantLinear

__all__ = ["ROLES", "Watch", "select"]

ROLES = {"input": "x", "weight": "w", "grad_output": "dy"}
"""Record tensor name -> GEMM operand role."""


def _linear_like(module: torch.nn.Module) -> bool:
    conv1d = hf_conv1d_class()
    return isinstance(module, torch.nn.Linear) or (conv1d is not None
                                                   and isinstance(module, conv1d))


def select(model: torch.nn.Module, modules: Any, converted: bool
           ) -> list[tuple[str, torch.nn.Module]]:
    """The (name, layer) pairs to watch: linear layers (converted ones when `converted`)
    that `modules` selects (None: all; names or `fnmatch` patterns; `fn(module, name)`)."""
    kind = (lambda m: isinstance(m, QuantLinear)) if converted else _linear_like
    layers = [(n, m) for n, m in model.named_modules() if kind(m)]
    if modules is None:
        chosen = layers
    elif callable(modules):
        chosen = [(n, m) for n, m in layers if modules(m, n)]
    else:
        patterns = list(modules)
        for p in patterns:
            if not isinstance(p, str):
                raise TypeError(f"modules must be None, a callable or names (str); got an "
                                f"element {p!r}")
        chosen = [(n, m) for n, m in layers if any(fnmatch.fnmatchcase(n, p) for p in patterns)]
        unmatched = [p for p in patterns if not any(fnmatch.fnmatchcase(n, p) for n, _ in layers)]
        if unmatched:
            raise ValueError(f"modules {unmatched!r} match no {'converted' if converted else ''}"
                             f" linear layer; the model has {[n for n, _ in layers]}")
    if not chosen:
        what = "converted (QuantLinear) layers" if converted else "linear layers"
        raise ValueError(f"inspect found no {what} to watch in the model (modules={modules!r})")
    return chosen


def _gemm_weight(module: torch.nn.Module) -> torch.Tensor:
    """The weight as the GEMMs take it, (N, K)."""
    m: Any = module
    if isinstance(module, QuantLinear):
        return m._gemm_weight()
    conv1d = hf_conv1d_class()
    w: torch.Tensor = m.weight
    return w.t() if conv1d is not None and isinstance(module, conv1d) else w


def _record(log: InspectLog, name: str, tensor: str, q: OperandQuantizer,
            t: torch.Tensor) -> None:
    if not log.wants(name, tensor, q.recipe):
        return
    with torch.no_grad():
        t2 = t.detach().reshape(-1, t.shape[-1])  # M,K  N,K  M,N
        stats = raw_stats(t2, q(t2), q.fmt, q.block_of(t2.shape))
        log.add(name, tensor, q.recipe, q.fmt.name, stats, q.end_step)


class Watch:
    """The hooks on `pairs`, installed only while a step is recorded.

    The quantizers are made once (shadow-mode delayed scaling keeps its amax history
    across steps); `set(True)` registers one forward hook per layer, `set(False)` removes
    them, so a step that is not recorded runs the model with no hook of the inspector's.
    `recipes` None: each layer's own recipe and state.
    """

    def __init__(self, pairs: list[tuple[str, torch.nn.Module]], recipes: list[Any] | None,
                 log: InspectLog) -> None:
        self._hooks = []
        for name, module in pairs:
            quantizers: dict[str, list[OperandQuantizer]] = {
                tensor: ([operand_quantizer(module.recipe, role, layer=module)]
                         if recipes is None else [operand_quantizer(r, role) for r in recipes])
                for tensor, role in ROLES.items()}
            self._hooks.append((module, _forward_hook(name, quantizers, log)))
        self._handles: list[Any] = []

    @property
    def installed(self) -> bool:
        """Whether the forward hooks are registered."""
        return bool(self._handles)

    def set(self, on: bool) -> None:
        """Register the forward hooks (`on`) or remove them; nothing if already so."""
        if on and not self._handles:
            self._handles = [m.register_forward_hook(h) for m, h in self._hooks]
        elif not on:
            for handle in self._handles:
                handle.remove()
            self._handles = []


def _forward_hook(name: str, quantizers: dict[str, list[OperandQuantizer]],
                  log: InspectLog) -> Callable[..., None]:
    def hook(module: torch.nn.Module, args: Iterable[Any], output: Any) -> None:
        if not log.recording:
            return
        x = next(iter(args), None)
        if not isinstance(x, torch.Tensor) or not x.is_floating_point() or x.numel() == 0:
            return
        for q in quantizers["input"]:
            _record(log, name, "input", q, x)
        for q in quantizers["weight"]:
            _record(log, name, "weight", q, _gemm_weight(module))
        if isinstance(output, torch.Tensor) and output.requires_grad:
            step = log.current_step

            def grad_hook(dy: torch.Tensor) -> None:
                if log.current_step == step:  # a backward of this recorded step
                    for q in quantizers["grad_output"]:
                        _record(log, name, "grad_output", q, dy)

            output.register_hook(grad_hook)
    return hook
