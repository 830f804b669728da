"""normlab's formats, rounding and scaled recipes on PyTorch tensors, on any device.

An optional extra: `pip install ".[torch]"`. Importing this package without PyTorch
raises ImportError with that line; the core package never imports torch. Every function
here is bit-identical to its NumPy twin in [normlab.precision][] for float32/float64
tensors, on CPU and GPU alike, because it works on the integer bits with plain tensor ops.

Examples
--------
>>> import torch, normlab.torch as nt
>>> nt.quantize(torch.tensor([1.0 + 2**-8]), torch.bfloat16)
tensor([1.])
"""

from __future__ import annotations

from normlab._moved import keep_old_paths
from normlab.torch._import import torch  # noqa: F401  (raises the install hint first)
from normlab.torch.blockwise import BlockwiseTensor, blockwise_quantize
from normlab.torch.formats import get_format
from normlab.torch.hadamard import inverse_random_hadamard_transform, random_hadamard_transform
from normlab.torch.mx import MXTensor, mx_quantize
from normlab.torch.namespace import TORCH  # noqa: F401  (registers the torch namespace)
from normlab.torch.nvfp4 import NVFP4Tensor, nvfp4_quantize
from normlab.torch.quantize import quantize, splitmix64, stochastic_words
from normlab.torch.scaling import Fp8Meta, Fp8Tensor, fp8_quantize, quantize_current_scaling
from normlab.torch.ste import quantize_ste

__all__ = [
    "BlockwiseTensor",
    "Fp8Meta",
    "Fp8Tensor",
    "MXTensor",
    "NVFP4Tensor",
    "blockwise_quantize",
    "fp8_quantize",
    "get_format",
    "inverse_random_hadamard_transform",
    "mx_quantize",
    "nvfp4_quantize",
    "quantize",
    "quantize_current_scaling",
    "quantize_ste",
    "random_hadamard_transform",
    "splitmix64",
    "stochastic_words",
]

# --- training (normlab.torch.training): QuantLinear, convert, recipes, AdamW ---
from normlab.torch.numerics import InspectLog, inspect
from normlab.torch.recipes import (
    Bf16Recipe,
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    Fp8RowwiseRecipe,
    MXRecipe,
    NVFP4Recipe,
)
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

__all__ += [
    "AdamW",
    "Bf16Recipe",
    "BlockwiseFp8Recipe",
    "ConvertSummary",
    "EvalModeTrainingWarning",
    "Fp8CurrentRecipe",
    "Fp8DelayedRecipe",
    "Fp8RowwiseRecipe",
    "InspectLog",
    "MXRecipe",
    "NVFP4Recipe",
    "QuantConv1D",
    "QuantLinear",
    "UnmatchedPatternWarning",
    "convert",
    "inspect",
    "no_quantization",
    "nonfinite_layers",
    "quantization_enabled",
    "training_step",
    "unconvert",
]


# The training stack's modules sat directly in this package before the layout by concern:
# each old path names the moved module itself.
keep_old_paths(
    __name__,
    {
        "nn": "normlab.torch.training.linear",
        "conv1d": "normlab.torch.training.conv1d",
        "optim": "normlab.torch.training.optim",
        "convert": "normlab.torch.training.convert",
        "_gemm": "normlab.torch.training._gemm",
        "_operand_ops": "normlab.torch.training._operand_ops",
        "_product_ops": "normlab.torch.training._product_ops",
        "_bf16_gemm": "normlab.torch.training._bf16_gemm",
        "_extra_state": "normlab.torch.training._extra_state",
        "_plan": "normlab.torch.training._plan",
        "_autocast": "normlab.torch.training._autocast",
        "_empty_batch": "normlab.torch.training._empty_batch",
        "recompute": "normlab.torch.training.recompute",
        "switch": "normlab.torch.training.switch",
        "training_mode": "normlab.torch.training.training_mode",
        "distributed": "normlab.torch.training.distributed",
        "steps": "normlab.torch.training.steps",
        "nonfinite": "normlab.torch.training.nonfinite",
    },
)
