"""Layers that compose the functional core: a small Module protocol with explicit backward.

Every module keeps its parameters ([Parameter][normlab.nn.Parameter], with `.data` and an
accumulated `.grad`), its state (running statistics, train/eval) and the cache between `forward`
and `backward`; the arithmetic of the norms and of dropout is the functional core's.

Examples
--------
>>> import numpy as np
>>> from normlab import nn
>>> rng = np.random.default_rng(0)
>>> block = nn.Residual(nn.Linear(4, 4, rng=rng), nn.LayerNorm(4), placement="pre")
>>> y = block(np.ones((2, 4), dtype=np.float32))
>>> dx = block.backward(np.ones_like(y))
>>> sorted(name for name, _ in block.named_parameters())
['norm.bias', 'norm.weight', 'sublayer.bias', 'sublayer.weight']
"""

from __future__ import annotations

from normlab.nn.activation import GELU, ReLU
from normlab.nn.attention import CausalSelfAttention, causal_attention_weights
from normlab.nn.batchnorm import BatchNorm
from normlab.nn.check import module_gradcheck
from normlab.nn.container import PreNormStack, Residual, Sequential
from normlab.nn.dropout import Dropout
from normlab.nn.linear import Embedding, Linear
from normlab.nn.loss import softmax_cross_entropy
from normlab.nn.module import Module, Parameter
from normlab.nn.normalization import GroupNorm, LayerNorm, RMSNorm
from normlab.nn.residual_init import admin_initialize, deepnorm_constants, deepnorm_init
from normlab.nn.transformer import MLP, TransformerBlock, TransformerLM

__all__ = [
    "GELU",
    "MLP",
    "BatchNorm",
    "CausalSelfAttention",
    "Dropout",
    "Embedding",
    "GroupNorm",
    "LayerNorm",
    "Linear",
    "Module",
    "Parameter",
    "PreNormStack",
    "RMSNorm",
    "ReLU",
    "Residual",
    "Sequential",
    "TransformerBlock",
    "TransformerLM",
    "admin_initialize",
    "causal_attention_weights",
    "deepnorm_constants",
    "deepnorm_init",
    "module_gradcheck",
    "softmax_cross_entropy",
]
