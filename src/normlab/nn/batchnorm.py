"""Batch normalisation as a layer: [BatchNorm][normlab.nn.BatchNorm] (Ioffe & Szegedy 2015).

Dimension letters: N = batch (and every other non-feature axis), C = features.

Contract: the layer owns `weight`/`bias` (gamma, beta) and the buffers
`running_mean`/`running_var`, and composes
[normlab.norms.batch_norm_forward][normlab.batch_norm_forward], which updates the buffers in
place in training mode (only after its input checks pass). normlab's momentum is the fraction of
the old statistic kept (0.9, the chapter's Listing 16.3); PyTorch's `momentum=m` corresponds to
`momentum=1 - m` here together with `unbiased_running_var=True`.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_eps, check_int, check_probability, compute_dtype
from normlab.nn._affine import affine_backward, affine_parameters, cast
from normlab.nn.module import Module
from normlab.norms import batch_norm_backward, batch_norm_forward

__all__ = ["BatchNorm"]


class BatchNorm(Module):
    """Normalise each feature over the batch; running statistics for evaluation.

    training: y = gamma * (x - mean_B) / sqrt(var_B + eps) + beta and
    running <- momentum * running + (1 - momentum) * batch statistic;
    eval: the same formula with the running mean and variance (constants).

    Parameters
    ----------
    num_features : int
        C, the length of the feature axis.
    momentum : float
        In [0, 1]: fraction of the old running statistic kept (0.9 default).
    eps : float
        Added to the variance (> 0).

    affine : bool
        Learn `weight` (1) and `bias` (0).
    axis : int
        Feature axis: -1 for (N, C) and channels-last, 1 for (N, C, H, W).
    unbiased_running_var : bool
        Store the unbiased batch variance in `running_var` (PyTorch); biased by default.
    dtype : dtype
        Dtype of the parameters and the running statistics.

    Attributes
    ----------
    weight, bias : Parameter
        gamma (init 1) and beta (init 0), shape (C,); absent without `affine`.
    running_mean, running_var : numpy.ndarray
        The running statistics (C,) (init 0 and 1), updated in place in training.
    num_features, momentum, eps, axis, unbiased_running_var
        The settings, as given.

    Raises
    ------
    ValueError, TypeError
        On bad sizes, momentum or eps; in forward on x without C features on `axis` (and, from
        the functional core, a training batch with one value per feature).

    Examples
    --------
    >>> bn = BatchNorm(3)
    >>> y = bn(np.random.default_rng(0).normal(size=(8, 3)))
    >>> bool(np.allclose(y.mean(axis=0), 0, atol=1e-6))
    True
    """

    running_mean: np.ndarray
    running_var: np.ndarray

    def __init__(
        self,
        num_features: int,
        momentum: float = 0.9,
        eps: float = 1e-5,
        affine: bool = True,
        axis: int = -1,
        unbiased_running_var: bool = False,
        *,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        self.num_features = check_int(num_features, "num_features", minimum=1)
        self.momentum = check_probability(momentum, "momentum", allow_one=True)
        self.eps = check_eps(eps)
        self.axis = check_int(axis, "axis")
        self.unbiased_running_var = bool(unbiased_running_var)
        self.weight, self.bias = affine_parameters(
            self.num_features, dtype, weight=affine, bias=affine
        )
        self.register_buffer("running_mean", np.zeros(self.num_features, dtype=dtype))
        self.register_buffer("running_var", np.ones(self.num_features, dtype=dtype))

    def forward(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x", min_ndim=1)
        if not -x.ndim <= self.axis < x.ndim or x.shape[self.axis] != self.num_features:
            raise ValueError(
                f"x must have {self.num_features} features (num_features) on axis {self.axis}; "
                f"got shape {x.shape}"
            )
        dt = compute_dtype(x.dtype)
        out, cache = batch_norm_forward(
            x, cast(self.weight, dt), cast(self.bias, dt), self.running_mean, self.running_var,
            self.training, self.momentum, self.eps, axis=self.axis,
            unbiased_running_var=self.unbiased_running_var,
        )
        self._save((cache,))
        return out

    def backward(self, dout: np.ndarray) -> np.ndarray:
        return affine_backward(self, batch_norm_backward, dout)

    def extra_repr(self) -> str:
        return (
            f"{self.num_features}, momentum={self.momentum}, eps={self.eps}, axis={self.axis}"
        )
