"""Optimizers with PyTorch's update formulas: SGD (momentum, Nesterov) and AdamW.

Contract: `params` is any iterable of objects with `.data` (a float ndarray, updated in
place) and `.grad` (a float ndarray of the same shape, or None: that parameter is
skipped, as in PyTorch). Optimizer state (momentum buffer, Adam moments) is float32, or
float64 for float64 parameters of either byte order (`'>f8'` too); the update is computed
in that precision and written back into `.data`'s dtype (so bfloat16/float16 parameters
are rounded to nearest: keep float32 master weights, see `normlab.precision.training.mixed_step`).
`step` validates every parameter (a writeable float array), gradient and state entry
before it changes anything. `state_dict` / `load_state_dict` use PyTorch's layout;
loading validates the whole dict first (see `normlab.nn._optimizer`).

Scalars follow PyTorch's single-tensor (CPU) implementation: hyperparameters and
Python-side bias corrections are computed in float64 and rounded to the state dtype when
they multiply an array. PyTorch's vectorised CPU kernels may fuse `a + alpha * b` into
one FMA, so agreement with torch.optim is to about one float32 ulp per step, not bit-exact.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np

from normlab._validate import check_bool, check_finite_real, check_int, check_nonneg, scalar_item
from normlab.nn._optimizer import Optimizer

__all__ = ["SGD", "AdamW"]


class SGD(Optimizer):
    """Stochastic gradient descent with momentum, dampening, weight decay and Nesterov.

    PyTorch's rule: `g <- g + wd * p`; with momentum, `b <- g` on the first step, then
    `b <- mu * b + (1 - dampening) * g`; `g <- g + mu * b` (Nesterov) or `g <- b`;
    finally `p <- p - lr * g`. Sutskever et al., ICML 2013 (momentum, Nesterov form).

    Parameters
    ----------
    params : iterable
        Objects with `.data` / `.grad` (e.g. `module.parameters()`).
    lr : float
        The learning rate, finite and >= 0.
    momentum : float
        mu, finite and >= 0 (0: no momentum buffer).
    dampening : float
        Finite; the new gradient's weight in the buffer is `1 - dampening`.
    weight_decay : float
        wd, finite and >= 0 (L2: added to the gradient).
    nesterov : bool
        Nesterov momentum; needs momentum > 0 and dampening 0.

    Attributes
    ----------
    params : list
        The parameters, in the order given.
    state : dict
        Per-parameter state (index -> `{"momentum_buffer": array}`).

    Raises
    ------
    TypeError, ValueError
        For bad parameters (as torch.optim.SGD).

    Examples
    --------
    >>> import types; p = types.SimpleNamespace(data=np.ones(2, np.float32),
    ...     grad=np.full(2, 0.5, np.float32))
    >>> SGD([p], lr=0.1).step(); p.data
    array([0.95, 0.95], dtype=float32)
    """

    _HYPER = ("lr", "momentum", "dampening", "weight_decay", "nesterov")
    lr: float
    momentum: float
    dampening: float
    weight_decay: float
    nesterov: bool

    def __init__(
        self,
        params: Iterable[Any],
        lr: float,
        momentum: float = 0.0,
        dampening: float = 0.0,
        weight_decay: float = 0.0,
        nesterov: bool = False,
    ) -> None:
        hyper = self._check_hyper({"lr": lr, "momentum": momentum, "dampening": dampening,
                                   "weight_decay": weight_decay, "nesterov": nesterov})
        super().__init__(params, hyper)

    def _check_hyper(self, values: Mapping[str, Any]) -> dict[str, Any]:
        lr, mu = check_nonneg(values["lr"], "lr"), check_nonneg(values["momentum"], "momentum")
        damp = check_finite_real(scalar_item(values["dampening"], "dampening"), "dampening")
        wd = check_nonneg(values["weight_decay"], "weight_decay")
        nesterov = check_bool(scalar_item(values["nesterov"], "nesterov"), "nesterov")
        if nesterov and (mu <= 0.0 or damp != 0.0):
            raise ValueError(
                "nesterov=True requires momentum > 0 and dampening == 0; "
                f"got momentum={values['momentum']!r}, dampening={values['dampening']!r}"
            )
        return {"lr": lr, "momentum": mu, "dampening": damp, "weight_decay": wd,
                "nesterov": nesterov}

    def _check_entry(self, i: int, entry: Mapping[str, Any],
                     hyper: Mapping[str, Any]) -> dict[str, Any]:
        unexpected = sorted(str(k) for k in entry if k != "momentum_buffer")
        if unexpected:
            raise ValueError(f"state['state'][{i}] may only hold 'momentum_buffer'; "
                             f"got {unexpected}")
        if entry.get("momentum_buffer") is None:  # torch stores None without momentum
            return {}
        return {"momentum_buffer": self._state_array(i, entry, "momentum_buffer")}

    def step(self) -> None:
        """One update of every parameter that has a gradient (all validated first)."""
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


class AdamW(Optimizer):
    """Adam with decoupled weight decay, PyTorch's formulation.

    For step t: `p <- p * (1 - lr * wd)`; `m <- m + (1 - b1) * (g - m)` (lerp);
    `v <- b2 * v + (1 - b2) * g * g`; `denom = sqrt(v) / sqrt(1 - b2^t) + eps`;
    `p <- p - (lr / (1 - b1^t)) * m / denom`.
    Loshchilov & Hutter, "Decoupled Weight Decay Regularization", ICLR 2019;
    Kingma & Ba, ICLR 2015.

    Parameters
    ----------
    params : iterable
        Objects with `.data` / `.grad` (e.g. `module.parameters()`).
    lr : float
        The learning rate, finite and >= 0.
    betas : tuple of float
        (b1, b2), each in [0, 1).
    eps : float
        Added to the denominator, >= 0.
    weight_decay : float
        wd, decoupled (multiplies the parameter by `1 - lr * wd`), >= 0.

    Attributes
    ----------
    params : list
        The parameters, in the order given.
    state : dict
        Per-parameter state (index -> `{"step", "exp_avg", "exp_avg_sq"}`).

    Raises
    ------
    TypeError, ValueError
        For bad parameters (as torch.optim.AdamW).

    Examples
    --------
    >>> import types; p = types.SimpleNamespace(data=np.ones(2, np.float32),
    ...     grad=np.ones(2, np.float32))
    >>> AdamW([p], lr=0.1, weight_decay=0.0).step(); np.round(p.data, 6)
    array([0.9, 0.9], dtype=float32)
    """

    _HYPER = ("lr", "betas", "eps", "weight_decay")
    lr: float
    betas: tuple[float, float]
    eps: float
    weight_decay: float

    def __init__(
        self,
        params: Iterable[Any],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 1e-2,
    ) -> None:
        hyper = self._check_hyper({"lr": lr, "betas": betas, "eps": eps,
                                   "weight_decay": weight_decay})
        super().__init__(params, hyper)

    def _check_hyper(self, values: Mapping[str, Any]) -> dict[str, Any]:
        lr, eps = check_nonneg(values["lr"], "lr"), check_nonneg(values["eps"], "eps")
        wd = check_nonneg(values["weight_decay"], "weight_decay")
        betas = values["betas"]
        if isinstance(betas, np.ndarray) and betas.shape == (2,):
            betas = tuple(betas.tolist())  # a pair saved through np.savez
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2); got {betas!r}")
        b = tuple(check_finite_real(scalar_item(x, f"betas[{k}]"), f"betas[{k}]")
                  for k, x in enumerate(betas))
        for k, x in enumerate(b):
            if not 0.0 <= x < 1.0:
                raise ValueError(f"betas[{k}] must be in [0, 1); got {betas[k]!r}")
        return {"lr": lr, "betas": (b[0], b[1]), "eps": eps, "weight_decay": wd}

    def _check_entry(self, i: int, entry: Mapping[str, Any],
                     hyper: Mapping[str, Any]) -> dict[str, Any]:
        keys = {"step", "exp_avg", "exp_avg_sq"}
        if set(entry) != keys:
            raise ValueError(f"state['state'][{i}] must have the keys {sorted(keys)}; "
                             f"got {sorted(str(k) for k in entry)}")
        step = check_int(scalar_item(entry["step"], f"state['state'][{i}]['step']"),
                         f"state['state'][{i}]['step']", minimum=1)
        m = self._state_array(i, entry, "exp_avg")
        v = self._state_array(i, entry, "exp_avg_sq")
        if not bool(np.all(v >= 0)):  # also catches NaN: sqrt(v) would poison the weights
            raise ValueError(f"state['state'][{i}]['exp_avg_sq'] must be >= 0 everywhere "
                             "(a second moment); it holds negative or NaN values")
        return {"step": step, "exp_avg": m, "exp_avg_sq": v}

    def step(self) -> None:
        """One update of every parameter that has a gradient (all validated first)."""
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
    """In place `start + w * (end - start)`, PyTorch's two-branch form for accuracy."""
    w = start.dtype.type(weight)
    if weight < 0.5:
        start += w * (end - start)
    else:
        start[...] = end - (end - start) * (start.dtype.type(1.0) - w)
