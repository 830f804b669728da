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

# --- training: QuantLinear, convert, recipes, AdamW (owner: torchtrain) ---
from normlab.torch.conv1d import QuantConv1D
from normlab.torch.convert import ConvertSummary, UnmatchedPatternWarning, convert, unconvert
from normlab.torch.nn import QuantLinear
from normlab.torch.nonfinite import nonfinite_layers
from normlab.torch.numerics import InspectLog, inspect
from normlab.torch.optim import AdamW
from normlab.torch.recipes import (
    Bf16Recipe,
    BlockwiseFp8Recipe,
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    Fp8RowwiseRecipe,
    MXRecipe,
    NVFP4Recipe,
)
from normlab.torch.steps import training_step
from normlab.torch.switch import no_quantization, quantization_enabled
from normlab.torch.training_mode import EvalModeTrainingWarning

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
