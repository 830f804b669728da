"""The functional norms: `*_forward(...) -> (out, cache)` and `*_backward(dout, cache)`.

LayerNorm, RMSNorm, their residual-add fusions, BatchNorm and GroupNorm; the cache classes
live in `normlab.norms._cache`.
"""

from __future__ import annotations

from normlab.norms._cache import BatchNormCache, GroupNormCache, LayerNormCache, RMSNormCache
from normlab.norms.add_norm import (
    add_layer_norm_backward,
    add_layer_norm_forward,
    add_rms_norm_backward,
    add_rms_norm_forward,
)
from normlab.norms.batch_norm import batch_norm_backward, batch_norm_forward
from normlab.norms.group_norm import group_norm_backward, group_norm_forward
from normlab.norms.layer_norm import layer_norm_backward, layer_norm_forward
from normlab.norms.rms_norm import rms_norm_backward, rms_norm_forward

__all__ = [
    "BatchNormCache",
    "GroupNormCache",
    "LayerNormCache",
    "RMSNormCache",
    "add_layer_norm_backward",
    "add_layer_norm_forward",
    "add_rms_norm_backward",
    "add_rms_norm_forward",
    "batch_norm_backward",
    "batch_norm_forward",
    "group_norm_backward",
    "group_norm_forward",
    "layer_norm_backward",
    "layer_norm_forward",
    "rms_norm_backward",
    "rms_norm_forward",
]
