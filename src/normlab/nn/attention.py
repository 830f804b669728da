"""Causal multi-head self-attention with an exact backward (Vaswani et al. 2017).

Dimension letters: B = batch, T = sequence length, C = model width, H = heads,
S = C / H head width.

Contract: the four projections are [Linear][normlab.nn.Linear] sub-modules `query`,
`key`, `value` and `out` (weights (C, C), PyTorch layout); the softmax is computed in
float64 for float64 inputs and float32 otherwise, after subtracting each row's maximum.
Position t attends to positions 0..t. `zero_qk=True` sets W^Q = W^K = 0 (and their biases),
the simplified model of Xiong et al. 2020 in which every position averages the values of its
prefix uniformly.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab._validate import as_float_array, check_int, compute_dtype
from normlab.nn.linear import Linear
from normlab.nn.module import Module

__all__ = ["CausalSelfAttention", "causal_attention_weights"]


def causal_attention_weights(q: np.ndarray, k: np.ndarray) -> np.ndarray:
    """softmax(q k^T / sqrt(S) + mask) for q, k of shape (B, H, T, S); returns (B, H, T, T).

    The mask is -inf above the diagonal, so row t is a distribution over positions <= t.
    """
    t = q.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1])
    scores = (q @ np.swapaxes(k, -1, -2)) * scale  # B,H,T,T
    allowed = np.tril(np.ones((t, t), dtype=bool))  # T,T
    scores = np.where(allowed, scores, -np.inf)
    scores -= scores.max(axis=-1, keepdims=True)  # the diagonal is always finite
    att = np.exp(scores)
    att /= att.sum(axis=-1, keepdims=True)
    return att


class CausalSelfAttention(Module):
    """Masked multi-head self-attention.

    Q = x W_Q^T + b_Q, K = x W_K^T + b_K, V = x W_V^T + b_V, split into H heads;
    A_h = softmax(Q_h K_h^T / sqrt(S) + M), M_ts = -inf for s > t;
    y = concat_h(A_h V_h) W_O^T + b_O.

    Backward (per head): dV = A^T dY, dA = dY V^T, dScores = A * (dA - rowsum(dA * A)),
    dQ = dScores K / sqrt(S), dK = dScores^T Q / sqrt(S), then through the projections.

    Parameters
    ----------
    d_model : int
        C, divisible by `n_heads`.
    n_heads : int
        H >= 1.
    rng : numpy.random.Generator
        Initialises the four projections.
    bias : bool
        Biases on the projections.
    zero_qk : bool
        Set W^Q, W^K (and their biases) to zero: uniform attention over the prefix.
    init : {"uniform", "xavier_normal", "normal"}
        Weight init of the projections (see [Linear][normlab.nn.Linear]).
    dtype : dtype
        Parameter dtype.

    Attributes
    ----------
    query, key, value, out : Linear
        The four (C, C) projections, W^Q, W^K, W^V and W^O.
    d_model, n_heads : int
        C and H.

    Raises
    ------
    ValueError
        When `d_model` is not divisible by `n_heads` or a size is < 1.

    Examples
    --------
    >>> attn = CausalSelfAttention(8, 2, rng=np.random.default_rng(0))
    >>> attn(np.zeros((1, 5, 8))).shape
    (1, 5, 8)
    """

    def __init__(
        self,
        d_model: int,
        n_heads: int,
        *,
        rng: np.random.Generator,
        bias: bool = True,
        zero_qk: bool = False,
        init: str = "uniform",
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        self.d_model = check_int(d_model, "d_model", minimum=1)
        self.n_heads = check_int(n_heads, "n_heads", minimum=1)
        if self.d_model % self.n_heads:
            raise ValueError(
                f"d_model must be divisible by n_heads; got d_model={d_model}, n_heads={n_heads}"
            )
        kw: dict[str, Any] = {"rng": rng, "init": init, "dtype": dtype}
        self.query = Linear(self.d_model, self.d_model, bias, **kw)
        self.key = Linear(self.d_model, self.d_model, bias, **kw)
        self.value = Linear(self.d_model, self.d_model, bias, **kw)
        self.out = Linear(self.d_model, self.d_model, bias, **kw)
        if zero_qk:
            for lin in (self.query, self.key):
                lin.weight.data[...] = 0
                if lin.bias is not None:
                    lin.bias.data[...] = 0

    def _split(self, a: np.ndarray) -> np.ndarray:
        b, t, _ = a.shape
        return a.reshape(b, t, self.n_heads, -1).transpose(0, 2, 1, 3)  # B,H,T,S

    @staticmethod
    def _merge(a: np.ndarray) -> np.ndarray:
        b, h, t, s = a.shape
        return a.transpose(0, 2, 1, 3).reshape(b, t, h * s)  # B,T,C

    def forward(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x")
        if x.ndim != 3 or x.shape[-1] != self.d_model:
            raise ValueError(
                f"x must have shape (batch, time, {self.d_model}) (d_model); got shape {x.shape}"
            )
        dt = compute_dtype(x.dtype)
        q = self._split(self.query(x).astype(dt, copy=False))  # B,H,T,S
        k = self._split(self.key(x).astype(dt, copy=False))  # B,H,T,S
        v = self._split(self.value(x).astype(dt, copy=False))  # B,H,T,S
        att = causal_attention_weights(q, k)  # B,H,T,T
        y = self._merge(att @ v)  # B,T,C
        self._save((q, k, v, att, x.dtype))
        return self.out(y.astype(x.dtype, copy=False))

    def backward(self, dout: np.ndarray) -> np.ndarray:
        q, k, v, att, in_dtype = self._take()
        dt = q.dtype
        scale = 1.0 / math.sqrt(q.shape[-1])
        dy = self._split(self.out.backward(dout).astype(dt, copy=False))  # B,H,T,S
        dv = np.swapaxes(att, -1, -2) @ dy  # B,H,T,S
        datt = dy @ np.swapaxes(v, -1, -2)  # B,H,T,T
        # softmax backward; masked entries have att = 0 and so get no gradient
        dscores = att * (datt - np.sum(datt * att, axis=-1, keepdims=True))  # B,H,T,T
        dq = (dscores @ k) * scale  # B,H,T,S
        dk = (np.swapaxes(dscores, -1, -2) @ q) * scale  # B,H,T,S
        dx = self.query.backward(self._merge(dq).astype(in_dtype, copy=False))
        dx = dx + self.key.backward(self._merge(dk).astype(in_dtype, copy=False))
        dx = dx + self.value.backward(self._merge(dv).astype(in_dtype, copy=False))
        return dx

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, n_heads={self.n_heads}"
