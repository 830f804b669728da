"""Softmax cross-entropy with its gradient, stable for any finite logits.

Dimension letters: N = leading dimensions (batch, time), V = number of classes.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._validate import as_float_array, compute_dtype

__all__ = ["softmax_cross_entropy"]


def softmax_cross_entropy(
    logits: Any,
    targets: Any,
    *,
    reduction: str = "mean",
) -> tuple[float, np.ndarray]:
    """Cross-entropy of softmax(logits) against integer targets, and d loss / d logits.

    loss_i = logsumexp(z_i) - z_i[t_i],  dloss_i/dz_i = softmax(z_i) - onehot(t_i)

    The maximum of each row is subtracted before `exp` (log-sum-exp trick), so logits of
    1e4 or -1e30 neither overflow nor lose the answer. Computed in float64 for float64
    logits and float32 otherwise; `loss` is a Python float and `dlogits` has the dtype of
    `logits`. With `reduction="mean"` both are divided by the number of targets (as
    `torch.nn.functional.cross_entropy`).

    Parameters
    ----------
    logits : array (N, V)
        Unnormalised scores; N may be several dimensions or none.
    targets : integer array (N)
        Class ids in [0, V).
    reduction : {"mean", "sum"}
        Divide the loss and the gradient by the number of targets (`"mean"`), or not.

    Returns
    -------
    loss : float
        The summed or mean cross-entropy.
    dlogits : numpy.ndarray
        The gradient (N, V) of `loss` with respect to `logits`, in the dtype of `logits`.


    Raises
    ------
    TypeError
        On non-float logits or non-integer targets.
    ValueError
        On shapes that do not match, targets outside [0, V), or another reduction.

    Examples
    --------
    >>> loss, d = softmax_cross_entropy(np.zeros((2, 4)), np.array([0, 3]))
    >>> round(loss, 6) == round(float(np.log(4)), 6)
    True
    """
    z = as_float_array(logits, "logits", min_ndim=1)
    t = np.asarray(targets)
    if not np.issubdtype(t.dtype, np.integer):
        raise TypeError(f"targets must be an integer array of class ids; got dtype {t.dtype}")
    if t.shape != z.shape[:-1]:
        raise ValueError(
            f"targets must have shape {z.shape[:-1]} (logits without the class axis); "
            f"got shape {t.shape}"
        )
    n_cls = z.shape[-1]
    if t.size and (t.min() < 0 or t.max() >= n_cls):
        raise ValueError(
            f"targets must lie in [0, {n_cls}) (number of classes); "
            f"got values in [{t.min()}, {t.max()}]"
        )
    if reduction not in ("mean", "sum"):
        raise ValueError(f"reduction must be 'mean' or 'sum'; got {reduction!r}")
    zc = z.astype(compute_dtype(z.dtype), copy=False).reshape(-1, n_cls)  # (N),V
    tf = t.reshape(-1)  # (N)
    rows = np.arange(tf.size)
    shifted = zc - zc.max(axis=-1, keepdims=True)  # (N),V  <= 0, max exactly 0
    with np.errstate(under="ignore"):  # exp of very negative logits is 0: intended
        exp = np.exp(shifted)
    sum_exp = exp.sum(axis=-1, keepdims=True)  # (N),1  in [1, V]
    log_probs_t = shifted[rows, tf] - np.log(sum_exp[:, 0])  # (N)
    total = -float(np.sum(log_probs_t, dtype=np.float64))
    scale = 1.0 / max(tf.size, 1) if reduction == "mean" else 1.0
    dz = exp / sum_exp  # softmax
    dz[rows, tf] -= 1.0
    dz *= scale
    return total * scale, dz.reshape(z.shape).astype(z.dtype, copy=False)
