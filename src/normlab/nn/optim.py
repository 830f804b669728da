"""Optimizers with PyTorch's update formulas: SGD (momentum, Nesterov) and AdamW.

Contract: ``params`` is any iterable of objects with ``.data`` (a float ndarray, updated in
place) and ``.grad`` (a float ndarray of the same shape, or None: that parameter is
skipped, as in PyTorch). Optimizer state (momentum buffer, Adam moments) is float32, or
float64 for float64 parameters; the update is computed in that precision and written back
into ``.data``'s dtype (so bfloat16/float16 parameters are rounded to nearest: keep float32
master weights, see :mod:`normlab.precision.mixed`). ``step`` validates every gradient
before it changes anything.

Scalars follow PyTorch's single-tensor (CPU) implementation: hyperparameters and
Python-side bias corrections are computed in float64 and rounded to the state dtype when
they multiply an array. PyTorch's vectorised CPU kernels may fuse ``a + alpha * b`` into
one FMA, so agreement with torch.optim is to about one float32 ulp per step, not bit-exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_finite_real, optional_grad

__all__ = ["SGD", "AdamW"]


def _nonneg(value: Any, name: str) -> float:
    v = check_finite_real(value, name)
    if v < 0.0:
        raise ValueError(f"{name} must be >= 0; got {value!r}")
    return v


class _Optimizer:
    """Shared parameter handling: validation, zero_grad, per-parameter state."""

    def __init__(self, params: Iterable[Any]) -> None:
        if isinstance(params, np.ndarray) or not isinstance(params, Iterable):
            raise TypeError(
                "params must be an iterable of objects with .data and .grad "
                f"(e.g. a list of Parameters); got {type(params).__name__}"
            )
        plist = list(params)
        if not plist:
            raise ValueError("params is empty: the optimizer has nothing to update")
        for i, p in enumerate(plist):
            if not (hasattr(p, "data") and hasattr(p, "grad")):
                raise TypeError(
                    f"params[{i}] must have .data and .grad attributes; got {type(p).__name__}"
                )
            if not isinstance(p.data, np.ndarray):
                raise TypeError(
                    f"params[{i}].data must be a numpy ndarray (updated in place); "
                    f"got {type(p.data).__name__}"
                )
            as_float_array(p.data, f"params[{i}].data")
        self.params = plist
        self.state: dict[int, dict[str, Any]] = {}

    @staticmethod
    def _state_dtype(p: Any) -> type[np.floating[Any]]:
        return np.float64 if p.data.dtype == np.float64 else np.float32

    def _grads(self) -> list[np.ndarray | None]:
        """Every gradient, validated before any parameter or state is touched."""
        return [
            optional_grad(p.grad, p.data.shape, f"params[{i}].grad")
            for i, p in enumerate(self.params)
        ]

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Set every ``.grad`` to None (PyTorch's default) or fill it with zeros in place."""
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad[...] = 0

    def _hyper(self) -> dict[str, Any]:
        raise NotImplementedError

    def state_dict(self) -> dict[str, Any]:
        """``{"state": {index: {name: value}}, "param_groups": [{hyperparameters, params}]}``
        (PyTorch's layout; arrays are copies)."""
        state = {
            i: {k: (v.copy() if isinstance(v, np.ndarray) else v) for k, v in s.items()}
            for i, s in self.state.items()
        }
        group = {**self._hyper(), "params": list(range(len(self.params)))}
        return {"state": state, "param_groups": [group]}


class SGD(_Optimizer):
    """Stochastic gradient descent with momentum, dampening, weight decay and Nesterov.

    PyTorch's rule: ``g <- g + wd * p``; with momentum, ``b <- g`` on the first step, then
    ``b <- mu * b + (1 - dampening) * g``; ``g <- g + mu * b`` (Nesterov) or ``g <- b``;
    finally ``p <- p - lr * g``. Sutskever et al., ICML 2013 (momentum, Nesterov form).

    Parameters
    ----------
    params: iterable of objects with ``.data`` / ``.grad``. lr, momentum, dampening,
        weight_decay: finite numbers >= 0. nesterov: needs momentum > 0 and dampening 0.

    Raises
    ------
    TypeError / ValueError for bad parameters (as torch.optim.SGD).

    Example
    -------
    >>> import types; p = types.SimpleNamespace(data=np.ones(2, np.float32),
    ...     grad=np.full(2, 0.5, np.float32))
    >>> SGD([p], lr=0.1).step(); p.data
    array([0.95, 0.95], dtype=float32)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        lr_, mu = _nonneg(lr, "lr"), _nonneg(momentum, "momentum")
        damp, wd = check_finite_real(dampening, "dampening"), _nonneg(weight_decay, "weight_decay")
        if not isinstance(nesterov, (bool, np.bool_)):
            raise TypeError(f"nesterov must be a bool; got {nesterov!r}")
        if nesterov and (mu <= 0.0 or damp != 0.0):
            raise ValueError(
                "nesterov=True requires momentum > 0 and dampening == 0; "
                f"got momentum={momentum!r}, dampening={dampening!r}"
            )
        super().__init__(params)
        self.lr, self.momentum, self.dampening = lr_, mu, damp
        self.weight_decay, self.nesterov = wd, bool(nesterov)

    def _hyper(self) -> dict[str, Any]:
        return {
            "lr": self.lr, "momentum": self.momentum, "dampening": self.dampening,
            "weight_decay": self.weight_decay, "nesterov": self.nesterov,
        }

    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        grads = self._grads()
        for i, (p, grad) in enumerate(zip(self.params, grads, strict=True)):
            if grad is None:
                continue
            dt = self._state_dtype(p)
            g = grad.astype(dt)  # always a new array: the caller's .grad is not modified
            if self.weight_decay != 0.0:
                g = g + dt(self.weight_decay) * p.data.astype(dt)
            if self.momentum != 0.0:
                st = self.state.setdefault(i, {})
                buf = st.get("momentum_buffer")
                if buf is None:
                    buf = g.copy()  # first step: the buffer is the gradient itself
                    st["momentum_buffer"] = buf
                else:
                    buf *= dt(self.momentum)
                    buf += dt(1.0 - self.dampening) * g
                g = g + dt(self.momentum) * buf if self.nesterov else buf
            new = p.data.astype(dt) + dt(-self.lr) * g
            p.data[...] = new.astype(p.data.dtype)


class AdamW(_Optimizer):
    """Adam with decoupled weight decay, PyTorch's formulation.

    For step t: ``p <- p * (1 - lr * wd)``; ``m <- m + (1 - b1) * (g - m)`` (lerp);
    ``v <- b2 * v + (1 - b2) * g * g``; ``denom = sqrt(v) / sqrt(1 - b2^t) + eps``;
    ``p <- p - (lr / (1 - b1^t)) * m / denom``.
    Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019;
    Kingma & Ba, ICLR 2015.

    Parameters
    ----------
    params: iterable of objects with ``.data`` / ``.grad``. lr, eps, weight_decay: >= 0.
    betas: two numbers in [0, 1).

    Raises
    ------
    TypeError / ValueError for bad parameters (as torch.optim.AdamW).

    Example
    -------
    >>> import types; p = types.SimpleNamespace(data=np.ones(2, np.float32),
    ...     grad=np.ones(2, np.float32))
    >>> AdamW([p], lr=0.1, weight_decay=0.0).step(); np.round(p.data, 6)
    array([0.9, 0.9], dtype=float32)
    """

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        lr_, eps_ = _nonneg(lr, "lr"), _nonneg(eps, "eps")
        wd = _nonneg(weight_decay, "weight_decay")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2); got {betas!r}")
        b = tuple(check_finite_real(x, f"betas[{k}]") for k, x in enumerate(betas))
        for k, x in enumerate(b):
            if not 0.0 <= x < 1.0:
                raise ValueError(f"betas[{k}] must be in [0, 1); got {betas[k]!r}")
        super().__init__(params)
        self.lr, self.betas, self.eps, self.weight_decay = lr_, (b[0], b[1]), eps_, wd

    def _hyper(self) -> dict[str, Any]:
        return {"lr": self.lr, "betas": self.betas, "eps": self.eps,
                "weight_decay": self.weight_decay}

    def step(self) -> None:
        """One update of every parameter that has a gradient."""
        grads = self._grads()
        b1, b2 = self.betas
        for i, (p, grad) in enumerate(zip(self.params, grads, strict=True)):
            if grad is None:
                continue
            dt = self._state_dtype(p)
            g = grad.astype(dt, copy=False)
            st = self.state.setdefault(i, {})
            if not st:
                st["step"] = 0
                st["exp_avg"] = np.zeros(p.data.shape, dt)
                st["exp_avg_sq"] = np.zeros(p.data.shape, dt)
            st["step"] += 1
            t = st["step"]
            m, v = st["exp_avg"], st["exp_avg_sq"]
            w = p.data.astype(dt)
            w *= dt(1.0 - self.lr * self.weight_decay)  # decoupled decay
            _lerp_(m, g, 1.0 - b1)
            v *= dt(b2)
            v += (dt(1.0 - b2) * g) * g  # addcmul: value * g * g, left to right
            step_size = self.lr / (1.0 - b1**t)
            bc2_sqrt = math.sqrt(1.0 - b2**t)
            denom = np.sqrt(v) / dt(bc2_sqrt) + dt(self.eps)
            w += (dt(-step_size) * m) / denom  # addcdiv: value * m / denom, left to right
            p.data[...] = w.astype(p.data.dtype)


def _lerp_(start: np.ndarray, end: np.ndarray, weight: float) -> None:
    """In place ``start + w * (end - start)``, PyTorch's two-branch form for accuracy."""
    w = start.dtype.type(weight)
    if weight < 0.5:
        start += w * (end - start)
    else:
        start[...] = end - (end - start) * (start.dtype.type(1.0) - w)
