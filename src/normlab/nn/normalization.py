"""Per-example normalisation layers: LayerNorm, RMSNorm, GroupNorm.

Dimension letters: B = leading (batch, time) dims, F = the normalised trailing dims
(`normalized_shape`), N = batch, C = channels, G = groups, S = spatial dims.

Contract: each layer holds its parameters and the functional cache, and composes the
functional pairs of `normlab.norms` (the arithmetic lives there, not here). Parameters
are cast to the input's compute dtype (float64 for float64 inputs, else float32) before the
call; outputs have the input's dtype. Parameter names follow PyTorch (`weight`, `bias`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

from normlab._validate import (
    as_float_array,
    as_shape,
    check_eps,
    check_finite_real,
    check_int,
    check_trailing,
    compute_dtype,
)
from normlab.nn._affine import accumulate, affine_backward, affine_parameters, cast
from normlab.nn.module import Module, Parameter
from normlab.norms import (
    group_norm_backward,
    group_norm_forward,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm_backward,
    rms_norm_forward,
)

# as_shape and check_trailing live in normlab._validate; re-exported for compatibility
__all__ = ["GroupNorm", "LayerNorm", "RMSNorm", "as_shape", "check_trailing"]


class LayerNorm(Module):
    """Layer normalisation over the trailing `normalized_shape` dims (Ba et al. 2016).

    y = gamma * (x - mean) / sqrt(var + eps) + beta, statistics per example (eq. 16.1).

    Parameters
    ----------
    normalized_shape : int or tuple of int
        F, the trailing dims normalised together.
    eps : float
        Added to the variance (> 0).
    elementwise_affine : bool
        Learn `weight` (gamma, init 1); without it there is no bias either.
    bias : bool
        Learn `bias` (beta, init 0) when `elementwise_affine`.
    dtype : dtype
        Parameter dtype.

    Attributes
    ----------
    weight, bias : Parameter
        gamma (init 1) and beta (init 0), of `normalized_shape`; absent without
        `elementwise_affine` (and `bias` without `bias`).
    normalized_shape : tuple of int
        F.
    eps : float
        Added to the variance.

    Raises
    ------
    ValueError, TypeError
        On bad sizes or eps (constructor) and on x whose trailing dims differ (forward).

    Examples
    --------
    >>> ln = LayerNorm(4)
    >>> y = ln(np.arange(8.0).reshape(2, 4)); bool(np.allclose(y.mean(axis=-1), 0))
    True
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-5,
        elementwise_affine: bool = True,
        bias: bool = True,
        *,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        self.normalized_shape = as_shape(normalized_shape)
        self.eps = check_eps(eps)
        self.weight, self.bias = affine_parameters(
            self.normalized_shape, dtype, weight=elementwise_affine, bias=bias
        )

    def forward(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x", min_ndim=1)
        check_trailing(x, self.normalized_shape, "LayerNorm")
        dt = compute_dtype(x.dtype)
        out, cache = layer_norm_forward(
            x, cast(self.weight, dt), cast(self.bias, dt), self.eps,
            normalized_ndim=len(self.normalized_shape),
        )
        self._save((cache,))
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        return affine_backward(self, layer_norm_backward, dout)

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, affine={self.weight is not None}"


class RMSNorm(Module):
    """Root-mean-square normalisation (Zhang & Sennrich 2019), eq. 16.2.

    y = (offset + weight) * x / sqrt(mean(x^2) + eps). With `offset=1` the weight is
    zero-centred (Gemma); it is initialised to `1 - offset` so the gain starts at 1.

    Parameters
    ----------
    normalized_shape : int or tuple of int
        F, the trailing dims normalised together.
    eps : float
        Added to the mean square (> 0; 1e-8 as in the chapter's listing).
    elementwise_affine : bool
        Learn `weight`.
    offset : float
        Added to the weight to form the gain.
    dtype : dtype
        Parameter dtype.

    Attributes
    ----------
    weight : Parameter
        Of `normalized_shape`, init `1 - offset` (the gain is `offset + weight`); absent
        without `elementwise_affine`.
    normalized_shape : tuple of int
        F.
    eps, offset : float
        As given.

    Raises
    ------
    ValueError, TypeError
        On bad sizes, eps or offset, or x whose trailing dims differ.

    Examples
    --------
    >>> y = RMSNorm(2)(np.array([[3.0, 4.0]])); bool(np.allclose((y**2).mean(), 1.0))
    True
    """

    def __init__(
        self,
        normalized_shape: int | Sequence[int],
        eps: float = 1e-8,
        elementwise_affine: bool = True,
        offset: float = 0.0,
        *,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        self.normalized_shape = as_shape(normalized_shape)
        self.eps = check_eps(eps)
        self.offset = check_finite_real(offset, "offset")
        self.weight: Parameter | None = None
        if elementwise_affine:
            self.weight = Parameter(np.full(self.normalized_shape, 1.0 - self.offset, dtype=dtype))

    def forward(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x", min_ndim=1)
        check_trailing(x, self.normalized_shape, "RMSNorm")
        out, cache = rms_norm_forward(
            x, cast(self.weight, compute_dtype(x.dtype)), self.eps, offset=self.offset,
            normalized_ndim=len(self.normalized_shape),
        )
        self._save((cache,))
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        (cache,) = self._take()
        dx, dweight = rms_norm_backward(dout, cache)
        accumulate(self.weight, dweight)
        return dx

    def extra_repr(self) -> str:
        return f"{self.normalized_shape}, eps={self.eps}, offset={self.offset}"


class GroupNorm(Module):
    """Group normalisation on (N, C, *S) inputs (Wu & He 2018), as `torch.nn.GroupNorm`.

    The C channels are split into G groups of C/G; each (example, group) is normalised over
    its channels and S, then y = gamma_c * x_hat + beta_c per channel.

    Parameters
    ----------
    num_groups : int
        G, must divide `num_channels`.
    num_channels : int
        C.
    eps : float
        Added to the variance (> 0).
    affine : bool
        Learn per-channel `weight` (1) and `bias` (0).
    dtype : dtype
        Parameter dtype.

    Attributes
    ----------
    weight, bias : Parameter
        Per-channel gamma (init 1) and beta (init 0), shape (C,); absent without `affine`.
    num_groups, num_channels : int
        G and C.
    eps : float
        Added to the variance.

    Raises
    ------
    ValueError
        When G does not divide C, on eps <= 0, or on x without C channels on axis 1.

    Examples
    --------
    >>> GroupNorm(2, 4)(np.ones((1, 4, 3))).shape
    (1, 4, 3)
    """

    def __init__(
        self,
        num_groups: int,
        num_channels: int,
        eps: float = 1e-5,
        affine: bool = True,
        *,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        self.num_groups = check_int(num_groups, "num_groups", minimum=1)
        self.num_channels = check_int(num_channels, "num_channels", minimum=1)
        if self.num_channels % self.num_groups:
            raise ValueError(
                f"num_groups must divide num_channels; got num_groups={num_groups}, "
                f"num_channels={num_channels}"
            )
        self.eps = check_eps(eps)
        self.weight, self.bias = affine_parameters(
            self.num_channels, dtype, weight=affine, bias=affine
        )

    def forward(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x")
        if x.ndim < 2 or x.shape[1] != self.num_channels:
            raise ValueError(
                f"x must have shape (N, {self.num_channels}, ...) (num_channels on axis 1); "
                f"got shape {x.shape}"
            )
        dt = compute_dtype(x.dtype)
        out, cache = group_norm_forward(
            x, self.num_groups, cast(self.weight, dt), cast(self.bias, dt), self.eps
        )
        self._save((cache,))
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        return affine_backward(self, group_norm_backward, dout)

    def extra_repr(self) -> str:
        return f"{self.num_groups}, {self.num_channels}, eps={self.eps}"
