"""Parameters and the Module protocol that every layer of [normlab.nn][] follows.

Contract: a [Module][normlab.nn.Module] holds parameters, buffers (running statistics) and the cache
between one `forward` and the matching `backward`; the arithmetic lives in the functional
core (`normlab.norms` and friends). `forward(x)` stores what the backward needs;
`backward(dout)` consumes it, *adds* every parameter gradient into `Parameter.grad`
(PyTorch semantics: a parameter shared by two layers receives both contributions) and
returns the gradient with respect to the input. A backward without a preceding forward (or a
second backward for one forward) raises `RuntimeError`.

Optimizers only use `Parameter.data` and `Parameter.grad`. Layers compute in the
precision of the input (float64 stays float64; float32, float16 and bfloat16 compute in
float32) and cast parameters to it, so a caller may write quantised values (for example
bfloat16 arrays) into `.data`; gradients are stored in float64 for float64 computations
and float32 otherwise.
"""

from __future__ import annotations

import warnings
from collections import OrderedDict
from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_bool, check_mapping, compute_dtype

__all__ = ["Module", "Parameter"]


class Parameter:
    """A trainable array with its accumulated gradient.

    Parameters
    ----------
    data : array_like
        The values (a real floating array; it is copied).
    name : str, optional
        A label for messages; [Module.named_parameters][normlab.nn.Module.named_parameters]
        gives the dotted path.

    Attributes
    ----------
    data : numpy.ndarray
        The current values; optimizers and precision code overwrite this attribute.
    grad : numpy.ndarray or None
        Sum of the gradients of every backward since the last `zero_grad` (None before).

    Examples
    --------
    >>> p = Parameter(np.zeros(3))
    >>> p.accumulate(np.ones(3)); p.accumulate(np.ones(3)); p.grad
    array([2., 2., 2.])
    """

    __slots__ = ("data", "grad", "name")

    def __init__(self, data: Any, name: str = "") -> None:
        self.data: np.ndarray = np.array(as_float_array(data, "Parameter data"), copy=True)
        self.grad: np.ndarray | None = None
        self.name = str(name)

    @property
    def shape(self) -> tuple[int, ...]:
        """Shape of [data][normlab.nn.Parameter.data]."""
        return tuple(self.data.shape)

    def accumulate(self, grad: np.ndarray) -> None:
        """Add `grad` into `self.grad` (float64 for float64 gradients, else float32)."""
        if tuple(grad.shape) != self.shape:
            raise ValueError(
                f"gradient for parameter {self.name!r} must have shape {self.shape}; "
                f"got shape {tuple(grad.shape)}"
            )
        if self.grad is None:
            self.grad = np.array(grad, dtype=compute_dtype(grad.dtype), copy=True)
        else:
            self.grad += grad

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Forget the accumulated gradient (None, or zeros with `set_to_none=False`)."""
        if set_to_none or self.grad is None:
            self.grad = None
        else:
            self.grad[...] = 0

    def __repr__(self) -> str:
        return f"Parameter(name={self.name!r}, shape={self.shape}, dtype={self.data.dtype})"


class Module:
    """Base class of every layer: parameters, buffers, sub-modules, train/eval, cache.

    Sub-classes implement `forward(x)` and `backward(dout)`. Attributes assigned a
    [Parameter][normlab.nn.Parameter] or a [Module][normlab.nn.Module] are registered
    automatically (in assignment order, which fixes the order of
    [named_parameters][normlab.nn.Module.named_parameters]); buffers are registered with
    [register_buffer][normlab.nn.Module.register_buffer].

    Attributes
    ----------
    training : bool
        True in training mode (the default), False after [eval][normlab.nn.Module.eval];
        layers such as Dropout and BatchNorm read it.

    Examples
    --------
    >>> from normlab.nn import Linear
    >>> lin = Linear(3, 2, rng=np.random.default_rng(0))
    >>> [name for name, _ in lin.named_parameters()]
    ['weight', 'bias']
    """

    training: bool

    def __init__(self) -> None:
        object.__setattr__(self, "_parameters", OrderedDict())
        object.__setattr__(self, "_modules", OrderedDict())
        object.__setattr__(self, "_buffers", OrderedDict())
        object.__setattr__(self, "_cache", None)
        object.__setattr__(self, "training", True)

    # -- registration -------------------------------------------------------------------
    def __setattr__(self, name: str, value: Any) -> None:
        if "_parameters" not in self.__dict__:
            raise RuntimeError(
                f"{type(self).__name__}.__init__ must call super().__init__() before "
                f"assigning attribute {name!r}"
            )
        params, modules, buffers = self._parameters, self._modules, self._buffers
        for registry in (params, modules, buffers):
            registry.pop(name, None)
        if isinstance(value, Parameter):
            if not value.name:
                value.name = name
            params[name] = value
        elif isinstance(value, Module):
            modules[name] = value
        else:
            object.__setattr__(self, name, value)
            return
        self.__dict__.pop(name, None)

    def __getattr__(self, name: str) -> Any:
        # Only called when normal lookup fails: look in the registries.
        for registry in ("_parameters", "_modules", "_buffers"):
            table = self.__dict__.get(registry)
            if table is not None and name in table:
                return table[name]
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def add_module(self, name: str, module: Module) -> None:
        """Register `module` under `name` (used for numbered children)."""
        if not isinstance(module, Module):
            raise TypeError(f"module {name!r} must be a normlab.nn.Module; got {module!r}")
        self._modules[name] = module

    def register_buffer(self, name: str, value: np.ndarray) -> None:
        """Register a non-trainable array (running statistics) saved by `state_dict`."""
        self.__dict__.pop(name, None)
        self._buffers[name] = value

    # -- traversal ----------------------------------------------------------------------
    def named_modules(self, prefix: str = "") -> Iterator[tuple[str, Module]]:
        """This module and every sub-module, depth first, with dotted names."""
        yield prefix, self
        for name, child in self._modules.items():
            yield from child.named_modules(f"{prefix}.{name}" if prefix else name)

    def named_parameters(self) -> Iterator[tuple[str, Parameter]]:
        """Every parameter once (a shared one under its first name), in registration order."""
        seen: set[int] = set()
        for mod_name, mod in self.named_modules():
            for name, p in mod._parameters.items():
                if id(p) not in seen:
                    seen.add(id(p))
                    yield (f"{mod_name}.{name}" if mod_name else name), p

    def parameters(self) -> list[Parameter]:
        """The parameters of [named_parameters][normlab.nn.Module.named_parameters], as a list."""
        return [p for _, p in self.named_parameters()]

    def named_buffers(self) -> Iterator[tuple[str, np.ndarray]]:
        """Every buffer with its dotted name."""
        for mod_name, mod in self.named_modules():
            for name, b in mod._buffers.items():
                yield (f"{mod_name}.{name}" if mod_name else name), b

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Reset the gradient of every parameter (see `Parameter.zero_grad`)."""
        set_to_none = check_bool(set_to_none, "set_to_none")
        for p in self.parameters():
            p.zero_grad(set_to_none)

    # -- modes --------------------------------------------------------------------------
    def train(self, mode: bool = True) -> Module:
        """Set training mode on this module and every sub-module; returns self."""
        mode = check_bool(mode, "mode")
        for _, mod in self.named_modules():
            object.__setattr__(mod, "training", mode)
        return self

    def eval(self) -> Module:
        """Evaluation mode (running statistics, dropout off); returns self."""
        return self.train(False)

    # -- state --------------------------------------------------------------------------
    def state_dict(self) -> dict[str, np.ndarray]:
        """Copies of every parameter and buffer, keyed by dotted name.

        Arrays only, so `np.savez(f, **module.state_dict())` works without pickle.
        """
        state: dict[str, np.ndarray] = {}
        for name, p in self.named_parameters():
            state[name] = p.data.copy()
        for name, b in self.named_buffers():
            state[name] = np.array(b, copy=True)
        return state

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Copy values into parameters and buffers (dtype of the target kept).

        Every key and shape is checked before anything is written. Each parameter gets a
        new `.data` array (optimizers hold the Parameter, so they follow), which is how a
        [MasterWeights][normlab.precision.MasterWeights] built earlier sees the load: it re-reads
        its masters from the new values instead of writing stale masters over them.

        Raises
        ------
        TypeError
            When `state` is not a mapping.
        ValueError
            On a missing or unexpected key, or a shape that differs from the target's.
        """
        check_mapping(state, "state", "a module state dict")
        targets: dict[str, tuple[str, Any]] = {}
        for name, p in self.named_parameters():
            targets[name] = ("param", p)
        for name, b in self.named_buffers():
            targets[name] = ("buffer", b)
        missing = sorted(set(targets) - set(state))
        unexpected = sorted(set(state) - set(targets))
        if missing or unexpected:
            raise ValueError(
                f"state keys must match the module's; missing {missing}, unexpected {unexpected}"
            )
        arrays = {}
        for name, (_, target) in targets.items():
            shape = target.shape if isinstance(target, Parameter) else np.shape(target)
            value = as_float_array(state[name], f"state[{name!r}]")
            if tuple(value.shape) != tuple(shape):
                raise ValueError(
                    f"state[{name!r}] must have shape {tuple(shape)}; got {tuple(value.shape)}"
                )
            arrays[name] = value
        for name, (kind, target) in targets.items():
            if kind == "param":
                target.data = np.array(arrays[name], dtype=target.data.dtype, copy=True)
            else:
                target[...] = arrays[name]

    # -- forward/backward -----------------------------------------------------------------
    def forward(self, x: Any) -> Any:
        """Compute the output and keep what the backward needs."""
        raise NotImplementedError(f"{type(self).__name__} must implement forward")

    def backward(self, dout: np.ndarray) -> np.ndarray | None:
        """Accumulate parameter gradients and return the input gradient."""
        raise NotImplementedError(f"{type(self).__name__} must implement backward")

    def __call__(self, x: Any) -> Any:
        return self.forward(x)

    def clear_cache(self) -> None:
        """Drop the forward caches of this module and every sub-module (frees memory after
        an evaluation-only forward; a following backward raises `RuntimeError`)."""
        for _, mod in self.named_modules():
            object.__setattr__(mod, "_cache", None)

    def _save(self, cache: Any) -> None:
        object.__setattr__(self, "_cache", cache)

    def _take(self) -> Any:
        """Return and forget the cache of the last forward; RuntimeError if there is none."""
        cache = self.__dict__.get("_cache")
        if cache is None:
            raise RuntimeError(
                f"{type(self).__name__}.backward called without a preceding forward (or a "
                "second time for one forward); call forward(x) first"
            )
        object.__setattr__(self, "_cache", None)
        return cache

    def extra_repr(self) -> str:
        """Constructor arguments shown by `repr`."""
        return ""

    def __repr__(self) -> str:
        children = "".join(
            "\n  " + f"({n}): {m!r}".replace("\n", "\n  ") for n, m in self._modules.items()
        )
        head = f"{type(self).__name__}({self.extra_repr()}"
        return head + (children + "\n)" if children else ")")


def param_dtype(x: np.ndarray) -> np.dtype:
    """Deprecated: use `normlab._validate.compute_dtype(x.dtype)` (the same rule)."""
    warnings.warn("normlab.nn.module.param_dtype is deprecated; it is compute_dtype(x.dtype) "
                  "from normlab._validate", DeprecationWarning, stacklevel=2)
    return compute_dtype(x.dtype)
