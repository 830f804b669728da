"""The training stack: converted layers, their GEMMs, optimizer, conversion and state.

* `linear` (`QuantLinear`) and `conv1d` (`QuantConv1D`): the recipe layers;
* `convert`: swap a model's linear layers for recipe layers and back (its rules in `_plan`);
* `optim`: AdamW for parameters stored in a low-precision format;
* `steps`, `switch`, `training_mode`, `recompute`: when a forward trains, evaluates or
  recomputes, and the step boundary of delayed scaling;
* `distributed`, `nonfinite`: amax all-reduces and non-finite operand counts;
* the autograd function of the three GEMMs (`_gemm`), their custom ops (`_operand_ops`,
  `_product_ops`), the bf16 GEMM (`_bf16_gemm`), autocast and the layer state
  (`_autocast`, `_extra_state`).

The formats, rounding and scaled-recipe twins of [normlab.precision][] sit one level up,
in `normlab.torch`, which re-exports the public names of this package.
"""

from __future__ import annotations

from normlab.torch.training.conv1d import QuantConv1D
from normlab.torch.training.convert import (
    ConvertSummary,
    UnmatchedPatternWarning,
    convert,
    unconvert,
)
from normlab.torch.training.linear import QuantLinear
from normlab.torch.training.nonfinite import nonfinite_layers
from normlab.torch.training.optim import AdamW
from normlab.torch.training.steps import training_step
from normlab.torch.training.switch import no_quantization, quantization_enabled
from normlab.torch.training.training_mode import EvalModeTrainingWarning

__all__ = [
    "AdamW",
    "ConvertSummary",
    "EvalModeTrainingWarning",
    "QuantConv1D",
    "QuantLinear",
    "UnmatchedPatternWarning",
    "convert",
    "no_quantization",
    "nonfinite_layers",
    "quantization_enabled",
    "training_step",
    "unconvert",
]
