"""Cache classes passed from each `*_forward` to its `*_backward`.

Contract (shared by the NumPy references and the kernels in [normlab.kernels][]):

* A cache holds **references** to the arrays the caller passed (never copies) plus small
  per-row or per-feature statistics. It never holds a new array of the input's size:
  backward recomputes `x_hat` from `x` and the statistics.
* The statistics `mean` and `rstd` are stored in the *compute dtype*: float64 when any
  of x and the parameters is float64, else float32 (float16 / bfloat16 / float32 inputs
  are computed in float32), i.e. `np.result_type(*(compute_dtype(a.dtype) for a in
  (x, params...)))` with `normlab._validate.compute_dtype`. Backward reads the
  compute dtype from `rstd.dtype`.
* `rstd = 1 / sqrt(var + eps)` (LayerNorm, BatchNorm, GroupNorm) or
  `1 / sqrt(mean(x**2) + eps)` (RMSNorm), with the variance biased (divide by n) and
  clipped at 0.

Dimension letters: B = leading (batch) dims `x.shape[:x.ndim - k]`, F = normalised
trailing dims `x.shape[x.ndim - k:]` (k = `normalized_ndim`), N = batch, C = features
or channels, G = groups.

Field list (shape, dtype of the statistics):

`LayerNormCache(x, gamma, beta, mean, rstd, eps, normalized_ndim)`
    x (*B, *F) any float dtype; gamma, beta (*F) or None; mean (*B) compute dtype;
    rstd (*B) compute dtype. Also used by `add_layer_norm_forward` with `x` = the new
    residual `x + residual`.
`RMSNormCache(x, weight, rstd, eps, offset, normalized_ndim)`
    x (*B, *F); weight (*F) or None (gain = offset + weight, or 1 when None);
    rstd (*B) compute dtype. Also used by `add_rms_norm_forward` (x = new residual).
`BatchNormCache(x, gamma, beta, mean, rstd, axis, training, eps)`
    x any shape with the feature axis `axis` (non-negative, normalised) of length C;
    gamma, beta (C,) or None; mean, rstd (C,) compute dtype: the batch statistics in
    training, the running statistics (as constants) in eval.
`GroupNormCache(x, gamma, beta, mean, rstd, num_groups, eps)`
    x (N, C, *S); gamma, beta (C,) or None; mean, rstd (N, G) compute dtype.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

__all__ = ["BatchNormCache", "GroupNormCache", "LayerNormCache", "RMSNormCache"]


class LayerNormCache(NamedTuple):
    """What LayerNorm's backward needs: the input, the parameters and per-row statistics.

    Attributes
    ----------
    x : numpy.ndarray
        The caller's input (*B, *F), a reference (for the fused add + norm: the new residual).
    gamma, beta : numpy.ndarray or None
        The gain and bias (*F), or None.
    mean : numpy.ndarray
        Per-row mean (*B), in the compute dtype.
    rstd : numpy.ndarray
        Per-row `1 / sqrt(var + eps)` (*B), in the compute dtype.
    eps : float
        The eps of the forward.
    normalized_ndim : int
        k, the number of normalised trailing dims.
    """

    x: np.ndarray  # (*B, *F), the caller's array (a reference)
    gamma: np.ndarray | None  # (*F) or None
    beta: np.ndarray | None  # (*F) or None
    mean: np.ndarray  # (*B), compute dtype
    rstd: np.ndarray  # (*B), compute dtype, 1/sqrt(var + eps)
    eps: float
    normalized_ndim: int


class RMSNormCache(NamedTuple):
    """What RMSNorm's backward needs: the input, the weight and per-row 1/rms.

    Attributes
    ----------
    x : numpy.ndarray
        The caller's input (*B, *F), a reference (for the fused add + norm: the new residual).
    weight : numpy.ndarray or None
        The weight (*F), or None (gain 1).
    rstd : numpy.ndarray
        Per-row `1 / sqrt(mean(x^2) + eps)` (*B), in the compute dtype.
    eps : float
        The eps of the forward.
    offset : float
        Added to the weight: the gain is `offset + weight`.
    normalized_ndim : int
        k, the number of normalised trailing dims.
    """

    x: np.ndarray  # (*B, *F)
    weight: np.ndarray | None  # (*F) or None
    rstd: np.ndarray  # (*B), compute dtype, 1/sqrt(mean(x^2) + eps)
    eps: float
    offset: float
    normalized_ndim: int


class BatchNormCache(NamedTuple):
    """What BatchNorm's backward needs: the input, the parameters, per-feature statistics.

    Attributes
    ----------
    x : numpy.ndarray
        The caller's input, any shape, C features on `axis` (a reference).
    gamma, beta : numpy.ndarray or None
        The gain and bias (C,), or None.
    mean : numpy.ndarray
        Per-feature mean (C,) in the compute dtype: the batch's in training, the running
        mean in eval.
    rstd : numpy.ndarray
        Per-feature `1 / sqrt(var + eps)` (C,) in the compute dtype, from the batch or the
        running variance.
    axis : int
        The feature axis, non-negative.
    training : bool
        True: batch statistics (they depend on x); False: running statistics (constants).
    eps : float
        The eps of the forward.
    """

    x: np.ndarray  # any shape, features on `axis` (length C)
    gamma: np.ndarray | None  # (C,) or None
    beta: np.ndarray | None  # (C,) or None
    mean: np.ndarray  # (C,), compute dtype
    rstd: np.ndarray  # (C,), compute dtype
    axis: int  # non-negative feature axis
    training: bool  # True: batch statistics (depend on x); False: running constants
    eps: float


class GroupNormCache(NamedTuple):
    """What GroupNorm's backward needs: the input, the parameters, per-group statistics.

    Attributes
    ----------
    x : numpy.ndarray
        The caller's input (N, C, *S), a reference.
    gamma, beta : numpy.ndarray or None
        The gain and bias (C,), or None.
    mean : numpy.ndarray
        Per-(sample, group) mean (N, G), in the compute dtype.
    rstd : numpy.ndarray
        Per-(sample, group) `1 / sqrt(var + eps)` (N, G), in the compute dtype.
    num_groups : int
        G.
    eps : float
        The eps of the forward.
    """


    x: np.ndarray  # (N, C, *S)
    gamma: np.ndarray | None  # (C,) or None
    beta: np.ndarray | None  # (C,) or None
    mean: np.ndarray  # (N, G), compute dtype
    rstd: np.ndarray  # (N, G), compute dtype
    num_groups: int
    eps: float
