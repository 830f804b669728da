"""AdamW for parameters stored in a low-precision format, without an fp32 master copy.

Contract: the Adam moments (and Kahan's compensation) are float32 tensors (as torchao's
`_AdamW` keeps them for bf16 parameters), also after `load_state_dict`, which in
`torch.optim.Optimizer` casts every floating state tensor except `step` to its parameter's
dtype. Each step computes the float32 update

    m <- m + (1 - b1) (g - m);  v <- b2 v + (1 - b2) g g
    delta = (-lr / (1 - b1^t)) m / (sqrt(v) / sqrt(1 - b2^t) + eps) - (lr wd) w

and writes `w <- round(w + delta)` into the parameter in place exactly as
[normlab.precision.LowPrecisionUpdater][] does: `w + delta` formed in float64 and
rounded once to the format (`"nearest"`: ties to even, updates below half an ulp are
lost; `"stochastic"`: unbiased, one seed `rng.integers(0, 2^63)` per parameter per step,
element i using `splitmix64(seed + i)`; `"kahan"`: compensated summation with a
compensation buffer held in the format, Zamirai et al. 2020). Given the same parameters,
gradients and generator, the result is bit-identical to the NumPy updater fed the same
delta. `state_dict()` holds the rounding mode and the generator's state next to torch's
entries, so a resumed run continues bit for bit in every mode. Anchor: torchao's bf16 AdamW
with `bf16_stochastic_round=True` (stochastic rounding of the update into bf16 parameters).
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from itertools import chain
from typing import Any

import numpy as np
import torch

from normlab._validate import check_finite_real, check_generator
from normlab.precision.formats.format import Format, get_format
from normlab.precision.training.lowp_update import kahan_add
from normlab.torch.quantize import quantize

__all__ = ["PARAM_ROUNDINGS", "AdamW"]

PARAM_ROUNDINGS = ("nearest", "stochastic", "kahan")
"""The accepted values of [AdamW][normlab.torch.training.optim.AdamW]'s `param_rounding`."""
_PARAM_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


def _nonneg(value: Any, name: str) -> float:
    v = check_finite_real(value, name)
    if v < 0.0:
        raise ValueError(f"{name} must be >= 0; got {value!r}")
    return v


class AdamW(torch.optim.Optimizer):
    """AdamW that rounds its update into the parameters' own format.

    Parameters
    ----------
    params : iterable
        Tensors or parameter groups (float32, bfloat16 or float16).
    lr, betas, eps, weight_decay
        As `torch.optim.AdamW` (each must be >= 0; betas a pair in [0, 1)).
    param_rounding : {"nearest", "stochastic", "kahan"}, optional
        How the update is rounded into the parameters. Default "nearest".
    fmt : Format or str, optional
        The format the parameters hold (a normlab Format or name); None (the default)
        takes it from each parameter's dtype (bf16, fp16, fp32). A narrower format (e.g.
        `"e4m3"`) in float32 parameters is allowed.
    rng : numpy.random.Generator, optional
        The generator of `"stochastic"` (one draw per parameter per step).
    seed : int, optional
        Builds the generator of `"stochastic"` when `rng` is None.

    Attributes
    ----------
    param_rounding : str
        The rounding mode, one of [PARAM_ROUNDINGS][normlab.torch.training.optim.PARAM_ROUNDINGS].
    rng : numpy.random.Generator or None
        The stochastic mode's generator (None in the other modes).

    Raises
    ------
    TypeError
        Bad hyperparameter types, a format that is neither a Format nor a name, a
        generator that is not a `numpy.random.Generator`, or a parameter that is not
        float32, bfloat16 or float16.
    ValueError
        Out-of-range hyperparameters, an unknown rounding mode or format.

    Examples
    --------
    >>> w = torch.nn.Parameter(torch.ones(1, dtype=torch.bfloat16))
    >>> opt = AdamW([w], lr=2.0**-10, weight_decay=0.0, param_rounding="kahan")
    >>> for _ in range(8):
    ...     w.grad = -torch.ones_like(w); opt.step()
    >>> w.item()  # nearest would have stayed at 1.0 (the step is below half a bf16 ulp)
    1.0078125
    """

    def __init__(self, params: Iterable[Any], lr: float = 1e-3,
                 betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 1e-2, *, param_rounding: str = "nearest",
                 fmt: Format | str | None = None, rng: np.random.Generator | None = None,
                 seed: int | None = None) -> None:
        if param_rounding not in PARAM_ROUNDINGS:
            raise ValueError(f"param_rounding must be one of {PARAM_ROUNDINGS}; "
                             f"got {param_rounding!r}")
        if not isinstance(betas, (tuple, list)) or len(betas) != 2:
            raise TypeError(f"betas must be a pair (beta1, beta2); got {betas!r}")
        for k, b in enumerate(betas):
            if not 0.0 <= check_finite_real(b, f"betas[{k}]") < 1.0:
                raise ValueError(f"betas[{k}] must be in [0, 1); got {b!r}")
        if param_rounding == "stochastic":
            rng = np.random.default_rng(seed) if rng is None else check_generator(rng)
        self.fmt = None if fmt is None else get_format(fmt)
        self.param_rounding, self.rng = param_rounding, rng
        defaults = {"lr": _nonneg(lr, "lr"), "betas": (float(betas[0]), float(betas[1])),
                    "eps": _nonneg(eps, "eps"), "weight_decay": _nonneg(weight_decay,
                                                                        "weight_decay")}
        super().__init__(params, defaults)
        for p in (p for g in self.param_groups for p in g["params"]):
            self._format_of(p)  # validate every parameter before the first step

    def state_dict(self) -> dict[str, Any]:
        """torch's optimizer state plus `"normlab"`: the rounding mode and generator state.

        Returns
        -------
        state : dict
            `"state"` and `"param_groups"` as `torch.optim.Optimizer.state_dict` gives them
            (float32 moments, integer `step`), and `"normlab"`: `{"param_rounding": str,
            "rng": the numpy bit generator's state dict, or None}`.
        """
        state = super().state_dict()
        rng = None if self.rng is None else copy.deepcopy(self.rng.bit_generator.state)
        state["normlab"] = {"param_rounding": self.param_rounding, "rng": rng}
        return state

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load [state_dict][normlab.torch.training.optim.AdamW.state_dict]'s output.

        The moments and the compensation stay float32 and the stochastic-rounding generator
        continues where it was saved. Validated before anything changes.

        Raises
        ------
        ValueError
            If the state was not saved by this optimizer class, its rounding mode differs,
            or a state tensor's shape does not match its parameter.
        """
        extra = state_dict.get("normlab") if isinstance(state_dict, dict) else None
        if not isinstance(extra, dict) or set(extra) != {"param_rounding", "rng"}:
            raise ValueError("state_dict has no 'normlab' entry with the rounding mode and "
                             "generator state: it was not saved by normlab.torch.AdamW")
        if extra["param_rounding"] != self.param_rounding:
            raise ValueError(f"state_dict was saved with param_rounding="
                             f"{extra['param_rounding']!r}; this optimizer uses "
                             f"{self.param_rounding!r}")
        if (extra["rng"] is None) != (self.rng is None):
            raise ValueError("state_dict's generator state does not match the rounding mode")
        if self.rng is not None:
            try:  # a throw-away generator of the same kind checks the state
                type(self.rng.bit_generator)().state = copy.deepcopy(extra["rng"])
            except (TypeError, ValueError, KeyError) as exc:
                raise ValueError(f"state_dict's generator state is not valid: {exc}") from exc
        saved = [g["params"] for g in state_dict["param_groups"]]
        mine = [g["params"] for g in self.param_groups]
        id_map = dict(zip(chain.from_iterable(saved), chain.from_iterable(mine), strict=False))
        kept = {}  # float32 copies, before torch casts them to the parameters' dtypes
        for pid, st in state_dict["state"].items():
            p = id_map.get(pid)
            for key, value in st.items():
                if p is None or not isinstance(value, torch.Tensor):
                    continue
                if value.shape != p.shape:
                    raise ValueError(f"state {key!r} of parameter {pid} has shape "
                                     f"{tuple(value.shape)}; the parameter has {tuple(p.shape)}")
                kept[(p, key)] = value.to(device=p.device, dtype=torch.float32, copy=True)
        super().load_state_dict(state_dict)
        for (p, key), value in kept.items():
            self.state[p][key] = value
        if self.rng is not None:
            self.rng.bit_generator.state = copy.deepcopy(extra["rng"])

    def _format_of(self, p: torch.Tensor) -> Format:
        if p.dtype not in _PARAM_DTYPES:
            raise TypeError(f"parameters must be float32, bfloat16 or float16; got {p.dtype}")
        if self.fmt is not None:
            return self.fmt
        return get_format(p.dtype)

    def _round(self, x64: torch.Tensor, fmt: Format, stochastic: bool) -> torch.Tensor:
        if not stochastic:
            return quantize(x64, fmt)
        assert self.rng is not None
        seed = int(self.rng.integers(0, 2**63, dtype=np.int64))  # as normlab.precision.quantize
        return quantize(x64, fmt, rounding="stochastic", seed=seed)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        """One update of every parameter that has a gradient; returns `closure()` if given."""
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is not None:
                    self._update(p, group)
        return loss

    def _update(self, p: torch.Tensor, group: dict[str, Any]) -> None:
        fmt = self._format_of(p)
        b1, b2 = group["betas"]
        lr, wd, eps = group["lr"], group["weight_decay"], group["eps"]
        st = self.state[p]
        if not st:
            st["step"] = 0
            st["exp_avg"] = torch.zeros_like(p, dtype=torch.float32)
            st["exp_avg_sq"] = torch.zeros_like(p, dtype=torch.float32)
            if self.param_rounding == "kahan":
                st["compensation"] = torch.zeros_like(p, dtype=torch.float32)
        st["step"] += 1
        t = st["step"]
        grad = p.grad
        assert grad is not None  # step() skips parameters without one
        g, w = grad.to(torch.float32), p.to(torch.float32)
        m, v = st["exp_avg"], st["exp_avg_sq"]
        # separate elementwise operations (no fused lerp/addcmul: those may use an FMA),
        # so every float32 result is correctly rounded and reproducible in NumPy
        m.add_((g - m) * (1.0 - b1))
        v.mul_(b2).add_((g * (1.0 - b2)) * g)
        denom = v.sqrt() / math.sqrt(1.0 - b2**t) + eps
        delta = (m * (-lr / (1.0 - b1**t))) / denom  # float32, each operation rounded
        if wd != 0.0:
            delta = delta - w * (lr * wd)
        w64, d64 = w.to(torch.float64), delta.to(torch.float64)
        if self.param_rounding == "kahan":
            new, comp = kahan_add(w64, d64, st["compensation"].to(torch.float64),
                                  lambda a: self._round(a, fmt, False))
            st["compensation"].copy_(comp)
        else:
            new = self._round(w64 + d64, fmt, self.param_rounding == "stochastic")
        p.copy_(new.to(p.dtype))
