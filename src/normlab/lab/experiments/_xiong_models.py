r"""The Transformer of Xiong et al. 2020 as the lab builds it: their initialisation, small sizes.

Shared by `normlab.lab.experiments.training_stability` and
`normlab.lab.experiments.xiong_gradients`. Xiong et al. (section 3.3, "Parameter
Initialization") analyse, and train with, the fairseq Transformer:

* weight matrices Xavier-normal, $N(0, 2 / (n_{in} + n_{out}))$; biases zero; LayerNorm
  gain 1 and bias 0;
* token embeddings $N(0, 1/d)$ multiplied by $\sqrt d$ on the way in (fairseq's
  `embed_scale`), so every coordinate of the input has variance 1 and
  $E\|x_0\|^2 = d$, the input scale their Lemma 2 assumes; learned position embeddings
  $N(0, 1/d)$ (fairseq's learned positions; theirs are added unscaled);
* the output layer is the word-embedding matrix: the loss is
  $-\log \mathrm{softmax}_y(W^{emb} x)$ (their section 3.3), so the head is tied to the
  token embedding (the unscaled table, as in fairseq);
* ReLU FFN of width 2d and 4 heads (their IWSLT14 model: d = 512, FFN 1024, 4 heads).

`_xiong_models.ScaledEmbedding` is the
$\sqrt d$ factor as a module (gradient multiplied by the same factor on the way back);
`_xiong_models.init_record` measures the built
model, so the report states the initialisation that actually ran.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.nn import Embedding, Linear, TransformerLM
from normlab.nn.module import Module

__all__ = ["FF_RATIO", "HEADS", "ScaledEmbedding", "init_record", "xiong_lm"]

HEADS = 4
"""Attention heads (Xiong et al.'s IWSLT14 model has 4)."""
FF_RATIO = 2
"""FFN width over model width (their IWSLT14 model: 1024 / 512)."""


class ScaledEmbedding(Module):
    r"""An [Embedding][normlab.nn.Embedding] whose output is multiplied by a constant.

    $y = s\,E[\mathrm{ids}]$; backward passes $s\,\partial L/\partial y$ to the table.

    Parameters
    ----------
    embedding : normlab.nn.Embedding
        The table (registered as `embedding`; tying a head to `embedding.weight` works).
    scale : float
        The factor $s$ ($\sqrt d$ in fairseq's Transformer).

    Examples
    --------
    >>> emb = Embedding(5, 4, rng=np.random.default_rng(0), std=0.5)
    >>> scaled = ScaledEmbedding(emb, 2.0)
    >>> bool(np.all(scaled.forward(np.array([1])) == 2 * emb.weight.data[1]))
    True
    """

    def __init__(self, embedding: Embedding, scale: float) -> None:
        super().__init__()
        self.embedding = embedding
        self.scale = float(scale)

    def forward(self, ids: Any) -> np.ndarray:
        out = self.embedding.forward(ids)  # N,D
        return out * out.dtype.type(self.scale)

    def backward(self, dout: np.ndarray) -> None:
        d = np.asarray(dout)
        self.embedding.backward(d * d.dtype.type(self.scale))
        return None


def xiong_lm(vocab: int, d: int, layers: int, context: int, placement: str,
             rng: np.random.Generator, dtype: Any = np.float32) -> TransformerLM:
    """A character LM with Xiong et al.'s initialisation (module docstring), ReLU, LayerNorm."""
    model = TransformerLM(
        vocab, d, HEADS, layers, context, placement, "layer", rng=rng, d_ff=FF_RATIO * d,
        tie_weights=True, embed_std=d**-0.5, activation="relu", init="xavier_normal",
        dtype=dtype,
    )  # fmt: skip
    scaled = ScaledEmbedding(model.token_embedding, math.sqrt(d))
    model.token_embedding = scaled  # type: ignore[assignment]  # same forward/backward
    return model


def init_record(model: TransformerLM) -> dict[str, Any]:
    r"""What the built model's initialisation is, measured on its arrays (for metrics.json).

    Returns the standard deviation of the embedded tokens (table times scale), the mean
    ratio of each Linear weight's standard deviation to the Xavier value
    $\sqrt{2 / (n_{in} + n_{out})}$, the largest absolute bias and whether the head is
    the token table.
    """
    tok = model.token_embedding
    table = tok.embedding.weight if isinstance(tok, ScaledEmbedding) else tok.weight
    scale = tok.scale if isinstance(tok, ScaledEmbedding) else 1.0
    linears = [m for _, m in model.named_modules() if isinstance(m, Linear)
               and m.weight is not table]  # fmt: skip
    ratios = [float(m.weight.data.std()) / math.sqrt(2.0 / sum(m.weight.shape)) for m in linears]
    biases = [float(np.max(np.abs(m.bias.data))) for m in linears if m.bias is not None]
    return {
        "token_input_std": float(table.data.std()) * scale,
        "token_table_std_times_sqrt_d": float(table.data.std()) * math.sqrt(table.shape[1]),
        "position_std_times_sqrt_d": float(model.position_embedding.weight.data.std())
        * math.sqrt(table.shape[1]),
        "linear_std_over_xavier": float(np.mean(ratios)),
        "max_abs_bias": max(biases, default=0.0),
        "head_tied_to_token_table": model.head.weight is table,
    }
