"""Affine maps and lookup tables: [Linear][normlab.nn.Linear] and [Embedding][normlab.nn.Embedding].

Dimension letters: N = any leading dimensions (batch, time...), I = in_features,
O = out_features, V = vocabulary size, D = embedding width.

Contract: `Linear` stores its weight as (O, I) like PyTorch (`y = x W^T + b`) so
state can be compared with `torch.nn.Linear` directly; `Embedding.weight` is (V, D), the
same layout as an output head `Linear(D, V)`, so the two can share one Parameter (weight
tying) and the backward adds both gradients.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab._validate import (
    as_float_array,
    check_finite_real,
    check_generator,
    check_int,
    compute_dtype,
)
from normlab.nn.module import Module, Parameter

__all__ = ["Embedding", "Linear"]

_INITS = ("uniform", "xavier_normal", "normal", "zeros")


def init_weight(
    shape: tuple[int, int],
    init: str,
    rng: np.random.Generator,
    dtype: Any,
    *,
    std: float = 0.02,
) -> np.ndarray:
    """Initial (O, I) weight.

    `"uniform"`: U(-1/sqrt(I), 1/sqrt(I)) (PyTorch's `nn.Linear` default);
    `"xavier_normal"`: N(0, 2/(I + O)) (Glorot & Bengio 2010, the init Xiong et al. 2020
    analyse); `"normal"`: N(0, std^2) (GPT-2 style); `"zeros"`: all zero.
    """
    fan_out, fan_in = shape
    if init == "uniform":
        bound = 1.0 / math.sqrt(fan_in) if fan_in > 0 else 0.0
        w = rng.uniform(-bound, bound, size=shape)
    elif init == "xavier_normal":
        w = rng.normal(0.0, math.sqrt(2.0 / (fan_in + fan_out)), size=shape)
    elif init == "normal":
        w = rng.normal(0.0, std, size=shape)
    elif init == "zeros":
        w = np.zeros(shape)
    else:
        raise ValueError(f"init must be one of {_INITS}; got {init!r}")
    return w.astype(dtype)


class Linear(Module):
    """Affine map `y = x W^T + b` on the last axis.

    Parameters
    ----------
    in_features, out_features : int
        I and O (>= 1).
    bias : bool
        Learn an additive bias b of shape (O,).
    rng : numpy.random.Generator
        Source of the initial weights (keyword, required).
    init : {"uniform", "xavier_normal", "normal", "zeros"}
        Weight init; `"uniform"` is PyTorch's U(-1/sqrt(I), 1/sqrt(I)), which the bias
        always uses (zeros for the other inits).
    std : float
        Standard deviation for `init="normal"`.
    dtype : dtype
        Parameter dtype (float32 default; float64 for gradient checks).

    Attributes
    ----------
    weight : Parameter
        W, shape (O, I) (PyTorch's layout): `y = x W^T + b`.
    bias : Parameter
        b, shape (O,); absent when `bias=False`.
    in_features, out_features : int
        I and O.

    Raises
    ------
    TypeError, ValueError
        On non-integer or non-positive sizes, an unknown init, or a missing generator.

    Examples
    --------
    >>> lin = Linear(4, 2, rng=np.random.default_rng(0))
    >>> lin(np.ones((3, 4), dtype=np.float32)).shape
    (3, 2)
    """

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        *,
        rng: np.random.Generator,
        init: str = "uniform",
        std: float = 0.02,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        self.in_features = check_int(in_features, "in_features", minimum=1)
        self.out_features = check_int(out_features, "out_features", minimum=1)
        check_generator(rng)
        std = check_finite_real(std, "std")
        shape = (self.out_features, self.in_features)
        self.weight = Parameter(init_weight(shape, init, rng, dtype, std=std))  # O,I
        self.bias: Parameter | None = None
        if bias:
            if init == "uniform":
                bound = 1.0 / math.sqrt(self.in_features)
                b = rng.uniform(-bound, bound, size=self.out_features)
            else:
                b = np.zeros(self.out_features)
            self.bias = Parameter(b.astype(dtype))  # O

    def forward(self, x: Any) -> np.ndarray:
        x = as_float_array(x, "x", min_ndim=1)
        if x.shape[-1] != self.in_features:
            raise ValueError(
                f"x must have {self.in_features} features on its last axis (in_features); "
                f"got shape {x.shape}"
            )
        dt = compute_dtype(x.dtype)
        xc = x.astype(dt, copy=False)  # N,I
        w = self.weight.data.astype(dt, copy=False)  # O,I
        out = xc @ w.T  # N,O
        if self.bias is not None:
            out += self.bias.data.astype(dt, copy=False)
        self._save((xc, x.dtype))
        return out.astype(x.dtype, copy=False)

    def backward(self, dout: np.ndarray) -> np.ndarray:
        xc, in_dtype = self._take()
        dt = xc.dtype
        d = np.asarray(dout).astype(dt, copy=False)  # N,O
        w = self.weight.data.astype(dt, copy=False)
        x2 = xc.reshape(-1, self.in_features)  # (N),I
        d2 = d.reshape(-1, self.out_features)  # (N),O
        self.weight.accumulate(d2.T @ x2)  # O,I
        if self.bias is not None:
            self.bias.accumulate(d2.sum(axis=0))
        dx = d @ w  # N,I
        return dx.astype(in_dtype, copy=False)

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}"
        )


class Embedding(Module):
    """Lookup table: integer ids (N,) -> rows of `weight` (N, D).

    `backward` scatter-adds `dout` into the rows that were looked up (a repeated id gets
    the sum) and returns None: integer ids have no gradient.

    Parameters
    ----------
    num_embeddings, embedding_dim : int
        V and D (>= 1).
    rng : numpy.random.Generator
        Source of the initial weights, N(0, std^2) (std 1 as in `torch.nn.Embedding`).
    std : float
        Standard deviation of the init (GPT-2 uses 0.02).
    dtype : dtype
        Parameter dtype.

    Attributes
    ----------
    weight : Parameter
        The table, shape (V, D).
    num_embeddings, embedding_dim : int
        V and D.

    Raises
    ------
    TypeError
        On non-integer ids (forward) or bad sizes.
    ValueError
        On ids outside [0, V).

    Examples
    --------
    >>> emb = Embedding(10, 4, rng=np.random.default_rng(0))
    >>> emb(np.array([[1, 2, 1]])).shape
    (1, 3, 4)
    """

    def __init__(
        self,
        num_embeddings: int,
        embedding_dim: int,
        *,
        rng: np.random.Generator,
        std: float = 1.0,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        self.num_embeddings = check_int(num_embeddings, "num_embeddings", minimum=1)
        self.embedding_dim = check_int(embedding_dim, "embedding_dim", minimum=1)
        check_generator(rng)
        std = check_finite_real(std, "std")
        shape = (self.num_embeddings, self.embedding_dim)
        self.weight = Parameter(rng.normal(0.0, std, size=shape).astype(dtype))  # V,D

    def forward(self, ids: Any) -> np.ndarray:
        idx = np.asarray(ids)
        if not np.issubdtype(idx.dtype, np.integer):
            raise TypeError(f"ids must be an integer array; got dtype {idx.dtype}")
        if idx.size and (idx.min() < 0 or idx.max() >= self.num_embeddings):
            raise ValueError(
                f"ids must lie in [0, {self.num_embeddings}) (num_embeddings); "
                f"got values in [{idx.min()}, {idx.max()}]"
            )
        self._save((idx,))
        return self.weight.data[idx]  # N,D

    def backward(self, dout: np.ndarray) -> None:
        (idx,) = self._take()
        d = np.asarray(dout)
        grad = np.zeros(self.weight.shape, dtype=compute_dtype(d.dtype))  # V,D
        np.add.at(grad, idx.reshape(-1), d.reshape(-1, self.embedding_dim))
        self.weight.accumulate(grad)
        return None

    def extra_repr(self) -> str:
        return f"{self.num_embeddings}, {self.embedding_dim}"
