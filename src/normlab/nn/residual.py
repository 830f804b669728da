"""Residual blocks: where the normalisation sits around `x + F(x)`.

========== ======================================== =========================================
placement  forward                                  source
========== ======================================== =========================================
pre        y = x + F(N(x))                          Xiong et al. 2020 (GPT-2's placement)
post       y = N(x + F(x))                          Vaswani et al. 2017
deepnorm   y = N(alpha x + F(x)), alpha a constant  Wang et al. 2022, "DeepNet"
sandwich   y = x + N_out(F(N_in(x)))                Ding et al. 2021 (CogView "Sandwich-LN");
                                                    Kim et al. 2025, "Peri-LN"; Gemma 2
admin      y = N(omega * x + F(x)), omega trained   Liu et al. 2020 ("Admin")
rezero     y = x + alpha F(x), alpha trained, no N  Bachlechner et al. 2020 ("ReZero")
========== ======================================== =========================================

Contract: the block owns only the residual arithmetic (addition, the constant or trainable
scale of the skip or branch); the norm and F are child modules whose backward it calls. The
gradient of the input is the sum of the skip path and the branch (chapter eq. 16.4):

* pre:       dx = dout + N'(F'(dout))          (a zero branch gives dx == dout exactly)
* sandwich:  dx = dout + N_in'(F'(N_out'(dout)))
* rezero:    dx = dout + F'(alpha dout),  dalpha = <dout, F(x)>
* post family, with ds = N'(dout) the gradient of the sum s:
  post dx = ds + F'(ds); deepnorm dx = alpha ds + F'(ds);
  admin dx = omega * ds + F'(ds), domega = sum over the rows of ds * x.

For the post family with a [LayerNorm][normlab.nn.LayerNorm] or [RMSNorm][normlab.nn.RMSNorm]
the addition and the norm run as one fused call (`add_layer_norm_forward` /
`add_rms_norm_forward` on `F(x)` and the scaled skip `alpha x` or `omega * x`). `omega` and
ReZero's `alpha` are [Parameter][normlab.nn.Parameter] s (in `state_dict`); DeepNorm's alpha is
a fixed constant of the architecture, like a norm's eps (see [normlab.nn.deepnorm_constants][]
for its value and the matching weight scale beta).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_finite_real, check_positive, compute_dtype
from normlab.nn._grad import input_grad
from normlab.nn.module import Module, Parameter
from normlab.nn.normalization import LayerNorm, RMSNorm
from normlab.norms import (
    add_layer_norm_backward,
    add_layer_norm_forward,
    add_rms_norm_backward,
    add_rms_norm_forward,
)

__all__ = ["PLACEMENTS", "Residual"]

PLACEMENTS = ("pre", "post", "deepnorm", "sandwich", "admin", "rezero")
"""The placements [Residual][normlab.nn.Residual] accepts (see the module docstring)."""
_NORM_AFTER_SUM = ("post", "deepnorm", "admin")


def _check_options(
    placement: Any, norm: Any, alpha: Any, omega: Any, out_norm: Any
) -> tuple[float | None, np.ndarray | None]:
    """Validate the placement-specific arguments; return (alpha, omega as an array)."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement must be one of {PLACEMENTS}; got {placement!r}")
    if norm is not None and not isinstance(norm, Module):
        raise TypeError(f"norm must be a normlab.nn.Module or None; got {norm!r}")
    if placement in ("deepnorm", "sandwich", "admin") and norm is None:
        raise ValueError(f"placement {placement!r} needs a norm; got norm=None")
    if placement == "rezero" and norm is not None:
        raise ValueError(f"placement 'rezero' has no norm (y = x + alpha F(x)); got norm={norm!r}")
    if placement == "sandwich":
        if not isinstance(out_norm, Module):
            raise TypeError(
                f"placement 'sandwich' needs out_norm, the normlab.nn.Module applied to F's "
                f"output (e.g. a second LayerNorm); got {out_norm!r}"
            )
    elif out_norm is not None:
        raise ValueError(f"out_norm is only used by placement 'sandwich'; got {placement!r}")
    a = None
    if placement in ("deepnorm", "rezero"):
        if alpha is None and placement == "deepnorm":
            raise ValueError(
                "placement 'deepnorm' needs alpha (the skip scale, e.g. (2N)^(1/4) for N "
                "decoder layers: see deepnorm_constants); got alpha=None"
            )
        if placement == "deepnorm":
            a = check_positive(alpha, "alpha")
        else:
            a = 0.0 if alpha is None else check_finite_real(alpha, "alpha")
    elif alpha is not None:
        raise ValueError(f"alpha is only used by 'deepnorm' and 'rezero'; got {placement!r}")
    w = None
    if placement == "admin":
        w = as_float_array(1.0 if omega is None else omega, "omega")
        if w.ndim > 1 or not np.all(np.isfinite(w)):
            raise ValueError(
                f"omega must be a finite scalar or a 1-D array over the features; got {omega!r}"
            )
    elif omega is not None:
        raise ValueError(f"omega is only used by placement 'admin'; got {placement!r}")
    return a, w


class Residual(Module):
    """Residual block `x -> x + F(x)` with a normalisation placed as `placement` says.

    See the module docstring for the six placements, their formulas and sources. With
    `norm=None` the "pre" and "post" placements are a plain `x + F(x)`.

    Parameters
    ----------
    sublayer : Module
        F, mapping x's shape to x's shape.
    norm : Module or None
        The normalisation (N, or N_in for "sandwich"); None only for "pre", "post" (plain
        sum) and "rezero" (which has none).
    placement : {"pre", "post", "deepnorm", "sandwich", "admin", "rezero"}
        Where the norm sits and how the skip path is scaled (see the module docstring).
    alpha : float, optional
        "deepnorm": the constant skip scale (required, > 0). "rezero": the initial value of
        the trainable branch scale (default 0, the paper's choice).
    omega : float or 1-D array, optional
        "admin": initial skip scale, a scalar or one value per feature (default 1.0; set it
        with [normlab.nn.admin_initialize][]).
    out_norm : Module, optional
        "sandwich": N_out, the norm applied to F's output (required).

    dtype : dtype
        Dtype of the `omega` / ReZero `alpha` parameters.

    Attributes
    ----------
    sublayer : Module
        F.
    norm : Module or None
        The normalisation.
    placement : str
        One of [PLACEMENTS][normlab.nn.residual.PLACEMENTS].
    deepnorm_alpha : float
        The constant skip scale of "deepnorm" (1.0 for the other placements).
    omega : Parameter
        "admin" only: the trainable skip scale.
    alpha : Parameter
        "rezero" only: the trainable branch scale.
    out_norm : Module
        "sandwich" only: the norm of F's output.

    Raises
    ------
    TypeError, ValueError
        On non-Module arguments, another placement, or an option its placement does not use.

    Examples
    --------
    >>> from normlab.nn import LayerNorm, Linear
    >>> blk = Residual(Linear(4, 4, rng=np.random.default_rng(0)), LayerNorm(4), "pre")
    >>> blk(np.ones((2, 4), dtype=np.float32)).shape
    (2, 4)
    >>> rz = Residual(Linear(4, 4, rng=np.random.default_rng(0)), None, "rezero")
    >>> x = np.ones((2, 4), dtype=np.float32); bool(np.all(rz(x) == x))  # alpha = 0 at init
    True
    """

    def __init__(
        self,
        sublayer: Module,
        norm: Module | None,
        placement: str = "pre",
        *,
        alpha: float | None = None,
        omega: Any = None,
        out_norm: Module | None = None,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        if not isinstance(sublayer, Module):
            raise TypeError(f"sublayer must be a normlab.nn.Module; got {sublayer!r}")
        a, w = _check_options(placement, norm, alpha, omega, out_norm)
        self.placement = placement
        self.norm = norm
        self.sublayer = sublayer
        self.deepnorm_alpha = a if placement == "deepnorm" else 1.0
        self.out_norm: Module | None = out_norm  # registered only for "sandwich"
        if w is not None:
            self.omega = Parameter(w.astype(dtype))  # () or C
        if placement == "rezero":
            self.alpha = Parameter(np.asarray(a, dtype=dtype))  # ()

    # -- forward ----------------------------------------------------------------------------
    def forward(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x")
        norm, p = self.norm, self.placement
        if p == "rezero":
            f = self.sublayer.forward(x)
            a = self.alpha.data.astype(compute_dtype(x.dtype))  # ()
            self._save(("rezero", f))
            return (x + a * f).astype(x.dtype, copy=False)
        if norm is None:
            self._save(("plain",))
            return x + self.sublayer.forward(x)
        if p == "pre":
            self._save(("pre",))
            return x + self.sublayer.forward(norm.forward(x))
        if p == "sandwich":
            out_norm = self.out_norm
            assert out_norm is not None  # checked in __init__
            self._save(("sandwich",))
            return x + out_norm.forward(self.sublayer.forward(norm.forward(x)))
        skip = self._scaled_skip(x)  # x, alpha x or omega * x
        f = self.sublayer.forward(x)
        if isinstance(norm, (LayerNorm, RMSNorm)):
            # fused add + norm; the sum itself is not needed after a post-norm block
            return self._fused_post_forward(norm, f, skip, x)
        self._save(("composed", x))
        return norm.forward(skip + f)

    def _scaled_skip(self, x: np.ndarray) -> np.ndarray:
        if self.placement == "deepnorm":
            return x * self.deepnorm_alpha  # a Python float keeps x's dtype
        if self.placement == "admin":
            w = self.omega.data
            if w.ndim == 1 and (x.ndim == 0 or x.shape[-1] != w.shape[0]):
                raise ValueError(
                    f"x must have {w.shape[0]} features on its last axis (the size of omega); "
                    f"got shape {x.shape}"
                )
            return (x * w.astype(compute_dtype(x.dtype))).astype(x.dtype, copy=False)
        return x

    def _fused_post_forward(
        self, norm: LayerNorm | RMSNorm, f: np.ndarray, skip: np.ndarray, x: np.ndarray
    ) -> np.ndarray:
        dt = compute_dtype(x.dtype)
        k = len(norm.normalized_shape)
        w = None if norm.weight is None else norm.weight.data.astype(dt, copy=False)
        if isinstance(norm, LayerNorm):
            b = None if norm.bias is None else norm.bias.data.astype(dt, copy=False)
            out, _, ln_cache = add_layer_norm_forward(f, skip, w, b, norm.eps, normalized_ndim=k)
            self._save(("fused", x, ln_cache))
        else:
            out, _, rms_cache = add_rms_norm_forward(
                f, skip, w, norm.eps, offset=norm.offset, normalized_ndim=k
            )
            self._save(("fused", x, rms_cache))
        return out

    # -- backward ---------------------------------------------------------------------------
    def backward(self, dout: np.ndarray) -> np.ndarray:
        kind, *rest = self._take()
        norm = self.norm
        if kind == "rezero":
            return self._rezero_backward(dout, rest[0])
        if kind == "plain" or norm is None:
            return dout + input_grad(self.sublayer, dout)
        if kind == "pre":
            # skip path + branch: dx = dout + N'(F'(dout))
            return dout + input_grad(norm, input_grad(self.sublayer, dout))
        if kind == "sandwich":
            out_norm = self.out_norm
            assert out_norm is not None  # checked in __init__
            dbranch = input_grad(self.sublayer, input_grad(out_norm, dout))
            return dout + input_grad(norm, dbranch)
        x = rest[0]
        if kind == "fused":
            ds = self._fused_norm_backward(norm, dout, rest[1])
        else:
            ds = input_grad(norm, dout)
        # the sum s = skip(x) + F(x) sends ds through the skip's scale and through F
        return self._skip_backward(ds, x) + input_grad(self.sublayer, ds)

    def _fused_norm_backward(self, norm: Module, dout: np.ndarray, cache: Any) -> np.ndarray:
        # no gradient arrives on the sum (post-norm keeps only N(s))
        if isinstance(norm, LayerNorm):
            ds, dgamma, dbeta = add_layer_norm_backward(dout, None, cache)
            if norm.bias is not None and dbeta is not None:
                norm.bias.accumulate(dbeta)
        else:
            ds, dgamma = add_rms_norm_backward(dout, None, cache)
        if norm.weight is not None and dgamma is not None:
            norm.weight.accumulate(dgamma)
        return ds

    def _skip_backward(self, ds: np.ndarray, x: np.ndarray) -> np.ndarray:
        if self.placement == "deepnorm":
            return ds * self.deepnorm_alpha
        if self.placement == "admin":
            cd = compute_dtype(x.dtype)
            w = self.omega.data  # () or C
            prod = ds.astype(cd, copy=False) * x.astype(cd, copy=False)  # x's shape
            self.omega.accumulate(prod.sum(axis=tuple(range(prod.ndim - w.ndim))))
            return (ds * w.astype(cd)).astype(ds.dtype, copy=False)
        return ds

    def _rezero_backward(self, dout: np.ndarray, f: np.ndarray) -> np.ndarray:
        cd = compute_dtype(f.dtype)
        a = self.alpha.data.astype(cd)  # ()
        d = np.asarray(dout)
        self.alpha.accumulate(np.sum(d.astype(cd, copy=False) * f.astype(cd, copy=False)))
        df = (d * a).astype(d.dtype, copy=False)  # the branch sees alpha * dout
        return d + input_grad(self.sublayer, df)

    def extra_repr(self) -> str:
        if self.placement == "deepnorm":
            return f"placement='deepnorm', alpha={self.deepnorm_alpha:g}"
        return f"placement={self.placement!r}"
