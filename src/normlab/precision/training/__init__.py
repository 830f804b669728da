"""Mixed-precision training, as the chapter describes it: the pieces around the model.

* `loss_scaling`: dynamic (GradScaler's rules) and static loss scalers;
* `master_weights`: float32 masters and the low-precision working copy;
* `mixed_step`: the guarded step (unscale, skip on overflow, clip, update, refresh);
* `lowp_update`: weights held in a low-precision format, updated without a master copy;
* `matmul`: `lowp_matmul`, a matrix product with low-precision inputs and accumulator.
"""

from __future__ import annotations

from normlab.precision.training.loss_scaling import DynamicLossScaler, StaticLossScaler
from normlab.precision.training.lowp_update import LowPrecisionUpdater
from normlab.precision.training.master_weights import MasterWeights
from normlab.precision.training.matmul import lowp_matmul
from normlab.precision.training.mixed_step import StepResult, clip_grad_norm, mixed_precision_step

__all__ = [
    "DynamicLossScaler",
    "LowPrecisionUpdater",
    "MasterWeights",
    "StaticLossScaler",
    "StepResult",
    "clip_grad_norm",
    "lowp_matmul",
    "mixed_precision_step",
]
