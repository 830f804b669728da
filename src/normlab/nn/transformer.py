"""A small decoder-only Transformer: MLP, TransformerBlock, TransformerLM.

[MLP][normlab.nn.MLP], [TransformerBlock][normlab.nn.TransformerBlock] and
[TransformerLM][normlab.nn.TransformerLM] follow Vaswani et al. 2017, with the norm placements
of Xiong et al. 2020.

Dimension letters: B = batch, T = time (<= context), C = model width d, V = vocabulary,
F = the MLP's hidden width d_ff.

Contract: a block is two [Residual][normlab.nn.Residual] sub-layers, attention then MLP, each
with its own norm, pre-norm `x + F(Norm(x))` or post-norm `Norm(x + F(x))`; a pre-norm
model adds a final norm before the output head. The gradient of the FFN weights that
Xiong et al.'s Theorem 1 is about is `model.ffn_weight(layer, "fc2").grad` after a
backward.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab._validate import check_eps, check_generator, check_int, check_probability
from normlab.nn.activation import GELU, ReLU
from normlab.nn.attention import CausalSelfAttention
from normlab.nn.container import PreNormStack, Residual, Sequential, input_grad
from normlab.nn.dropout import Dropout
from normlab.nn.linear import Embedding, Linear
from normlab.nn.loss import softmax_cross_entropy
from normlab.nn.module import Module, Parameter
from normlab.nn.normalization import LayerNorm, RMSNorm

__all__ = ["MLP", "TransformerBlock", "TransformerLM", "make_norm"]


def _check_width_and_dropout(rng: Any, d: Any, dropout: Any) -> tuple[int, float]:
    """The checks every transformer constructor starts with: `rng`, then `(d, dropout)`."""
    check_generator(rng)
    return check_int(d, "d", minimum=1), check_probability(dropout, "dropout")


def make_norm(kind: str, d: int, eps: float | None, dtype: Any) -> Module:
    """`LayerNorm(d)` for `"layer"`, `RMSNorm(d)` for `"rms"` (default eps each)."""
    if kind == "layer":
        return LayerNorm(d, 1e-5 if eps is None else eps, dtype=dtype)
    if kind == "rms":
        return RMSNorm(d, 1e-8 if eps is None else eps, dtype=dtype)
    raise ValueError(f"norm must be 'layer' or 'rms'; got {kind!r}")


class MLP(Module):
    """Position-wise feed-forward network: fc2(act(fc1(x))), act = GELU (exact) or ReLU.

    Parameters
    ----------
    d, d_ff : int
        C and F.
    rng : numpy.random.Generator
        Initialises the two [Linear][normlab.nn.Linear] layers (keyword, required).
    activation : {"gelu", "relu"}
        The nonlinearity between them (exact GELU, or ReLU).
    bias : bool
        Learn the biases of both layers.
    init : {"uniform", "xavier_normal", "normal"}
        Weight init; see [Linear][normlab.nn.Linear].
    dtype : numpy.dtype
        Parameter dtype.

    Attributes
    ----------
    fc1, fc2 : Linear
        The (F, C) and (C, F) layers.
    act : Module
        The nonlinearity ([GELU][normlab.nn.GELU] or [ReLU][normlab.nn.ReLU]).

    Examples
    --------
    >>> MLP(4, 16, rng=np.random.default_rng(0))(np.ones((2, 4), dtype=np.float32)).shape
    (2, 4)
    """

    def __init__(
        self,
        d: int,
        d_ff: int,
        *,
        rng: np.random.Generator,
        activation: str = "gelu",
        bias: bool = True,
        init: str = "uniform",
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        if activation not in ("gelu", "relu"):
            raise ValueError(f"activation must be 'gelu' or 'relu'; got {activation!r}")
        self.fc1 = Linear(d, d_ff, bias, rng=rng, init=init, dtype=dtype)
        self.act = GELU() if activation == "gelu" else ReLU()
        self.fc2 = Linear(d_ff, d, bias, rng=rng, init=init, dtype=dtype)

    def forward(self, x: Any) -> np.ndarray:
        return self.fc2.forward(self.act.forward(self.fc1.forward(x)))

    def backward(self, dout: np.ndarray) -> np.ndarray:
        return self.fc1.backward(self.act.backward(self.fc2.backward(dout)))


class TransformerBlock(Module):
    """Attention and MLP sub-layers with residuals, pre- or post-norm.

    ```text
    pre:  h = x + Attn(N1(x));  y = h + MLP(N2(h))
    post: h = N1(x + Attn(x));  y = N2(h + MLP(h))
    ```

    Parameters
    ----------
    d, n_heads, d_ff : int
        Width C, heads H (dividing C), MLP width F.
    placement : {"pre", "post"}
        Where the norms sit: on the branch input (pre) or after the residual sum (post).
    norm : {"layer", "rms"}
        [LayerNorm][normlab.nn.LayerNorm] or [RMSNorm][normlab.nn.RMSNorm].
    dropout : float
        Drop probability applied to each branch output in training (0: no Dropout layer).
    rng : numpy.random.Generator
        Initialises the weights and drives dropout.
    activation, bias, init
        See [MLP][normlab.nn.MLP].
    zero_qk : bool
        W^Q = W^K = 0 (uniform causal attention; Xiong et al.'s simplified model).
    eps : float or None
        Norm eps (None: each norm's default).
    dtype : numpy.dtype
        Parameter dtype.

    Attributes
    ----------
    attn_residual, mlp_residual : Residual
        The two residual sub-layers (attention, then MLP), each with its norm.
    attention : CausalSelfAttention
        The attention sub-module (also inside `attn_residual`), for reading its weights.
    ffn : MLP
        The MLP sub-module (also inside `mlp_residual`), for reading its weights.
    placement : str
        `"pre"` or `"post"`.

    Raises
    ------
    ValueError, TypeError
        On bad sizes or options.

    Examples
    --------
    >>> blk = TransformerBlock(8, 2, 16, rng=np.random.default_rng(0))
    >>> blk(np.zeros((1, 3, 8), dtype=np.float32)).shape
    (1, 3, 8)
    """

    attention: CausalSelfAttention  # the attention sub-module (also inside attn_residual)
    ffn: MLP  # the MLP sub-module (also inside mlp_residual)

    def __init__(
        self,
        d: int,
        n_heads: int,
        d_ff: int,
        placement: str = "pre",
        norm: str = "layer",
        dropout: float = 0.0,
        *,
        rng: np.random.Generator,
        activation: str = "gelu",
        bias: bool = True,
        init: str = "uniform",
        zero_qk: bool = False,
        eps: float | None = None,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        d, p = _check_width_and_dropout(rng, d, dropout)
        d_ff = check_int(d_ff, "d_ff", minimum=1)
        if eps is not None:
            eps = check_eps(eps)
        attn = CausalSelfAttention(
            d, n_heads, rng=rng, bias=bias, zero_qk=zero_qk, init=init, dtype=dtype
        )
        mlp = MLP(d, d_ff, rng=rng, activation=activation, bias=bias, init=init, dtype=dtype)
        branch1: Module = Sequential(attn, Dropout(p, rng)) if p > 0 else attn
        branch2: Module = Sequential(mlp, Dropout(p, rng)) if p > 0 else mlp
        self.attn_residual = Residual(branch1, make_norm(norm, d, eps, dtype), placement)
        self.mlp_residual = Residual(branch2, make_norm(norm, d, eps, dtype), placement)
        # plain references (not registered twice) for reading weights and gradients
        object.__setattr__(self, "attention", attn)
        object.__setattr__(self, "ffn", mlp)
        self.placement = placement

    def forward(self, x: Any) -> np.ndarray:
        return self.mlp_residual.forward(self.attn_residual.forward(x))

    def backward(self, dout: np.ndarray) -> np.ndarray:
        return self.attn_residual.backward(self.mlp_residual.backward(dout))


class TransformerLM(Module):
    """Token + learned position embedding, L blocks, final norm (pre-norm), linear head.

    `logits = Head(FinalNorm(Blocks(E_tok[ids] + E_pos[0..T-1])))`

    Parameters
    ----------
    vocab, d, n_heads, n_layers, context : int
        V, C, H, L and the longest sequence T.
    placement : {"pre", "post"}
        Post-norm models have no final norm (their last block ends with a norm).
    norm : {"layer", "rms"}
        [LayerNorm][normlab.nn.LayerNorm] or [RMSNorm][normlab.nn.RMSNorm] in every block.
    rng : numpy.random.Generator
        Initialises the weights and drives dropout (keyword, required).

    d_ff : int or None
        MLP width (4 d when None).
    dropout : float
        On the embeddings and every branch output, in training.
    tie_weights : bool
        Share the token embedding with the head (both gradients are added).
    embed_std : float
        Std of the N(0, std^2) embedding init (0.02 as GPT-2).
    activation, init, eps, dtype
        See [TransformerBlock][normlab.nn.TransformerBlock].

    Attributes
    ----------
    token_embedding, position_embedding : Embedding
        E_tok (V, C) and E_pos (T, C).
    embed_dropout : Dropout
        Dropout on the summed embeddings.
    body : PreNormStack
        The L blocks and, for pre-norm, the final norm.
    head : Linear
        The (V, C) output layer (its weight is the token embedding's with `tie_weights`).
    context : int
        T, the longest sequence.

    Examples
    --------
    >>> lm = TransformerLM(11, 8, 2, 2, 6, rng=np.random.default_rng(0))
    >>> lm(np.array([[1, 2, 3]])).shape
    (1, 3, 11)
    """

    def __init__(
        self,
        vocab: int,
        d: int,
        n_heads: int,
        n_layers: int,
        context: int,
        placement: str = "pre",
        norm: str = "layer",
        *,
        rng: np.random.Generator,
        d_ff: int | None = None,
        dropout: float = 0.0,
        tie_weights: bool = False,
        embed_std: float = 0.02,
        activation: str = "gelu",
        init: str = "uniform",
        eps: float | None = None,
        dtype: Any = np.float32,
    ) -> None:
        super().__init__()
        d, p = _check_width_and_dropout(rng, d, dropout)
        n_layers = check_int(n_layers, "n_layers", minimum=1)
        self.context = check_int(context, "context", minimum=1)
        ff = 4 * d if d_ff is None else check_int(d_ff, "d_ff", minimum=1)
        self.token_embedding = Embedding(vocab, d, rng=rng, std=embed_std, dtype=dtype)
        self.position_embedding = Embedding(self.context, d, rng=rng, std=embed_std, dtype=dtype)
        self.embed_dropout = Dropout(p, rng)
        blocks = [
            TransformerBlock(
                d, n_heads, ff, placement, norm, p, rng=rng, activation=activation,
                init=init, eps=eps, dtype=dtype,
            )
            for _ in range(n_layers)
        ]
        final = make_norm(norm, d, eps, dtype) if placement == "pre" else None
        self.body = PreNormStack(blocks, final)
        self.head = Linear(d, vocab, bias=False, rng=rng, init=init, dtype=dtype)
        if tie_weights:
            self.head.weight = self.token_embedding.weight

    @property
    def blocks(self) -> list[TransformerBlock]:
        """The L blocks, first to last."""
        return [b for b in self.body.blocks if isinstance(b, TransformerBlock)]

    def ffn_weight(self, layer: int = -1, which: str = "fc2") -> Parameter:
        """The FFN weight W^1 (`"fc1"`) or W^2 (`"fc2"`) of block `layer`."""
        if which not in ("fc1", "fc2"):
            raise ValueError(f"which must be 'fc1' or 'fc2'; got {which!r}")
        mlp: MLP = self.blocks[layer].ffn
        return mlp.fc1.weight if which == "fc1" else mlp.fc2.weight

    def forward(self, ids: Any) -> np.ndarray:
        idx = np.asarray(ids)
        if idx.ndim != 2 or not 1 <= idx.shape[1] <= self.context:
            raise ValueError(
                f"ids must have shape (batch, time) with 1 <= time <= {self.context} (context); "
                f"got shape {idx.shape}"
            )
        tok = self.token_embedding.forward(idx)  # B,T,C
        pos = self.position_embedding.forward(np.arange(idx.shape[1]))  # T,C
        h = self.embed_dropout.forward(tok + pos)  # B,T,C
        return self.head.forward(self.body.forward(h))  # B,T,V

    def backward(self, dout: np.ndarray) -> None:
        dh = input_grad(self.body, self.head.backward(dout))  # B,T,C
        dh = self.embed_dropout.backward(dh)
        self.token_embedding.backward(dh)
        self.position_embedding.backward(dh.sum(axis=0))  # T,C
        return None

    def loss_and_grad(self, ids: Any, targets: Any) -> float:
        """Forward, mean softmax cross-entropy against `targets` (B, T), backward.

        Gradients are added into every `Parameter.grad`; returns the loss.
        """
        loss, dlogits = softmax_cross_entropy(self.forward(ids), targets)
        self.backward(dlogits)
        return loss
