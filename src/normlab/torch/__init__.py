"""normlab on PyTorch tensors: training recipes, QuantLinear, convert, a low-precision AdamW.

Needs the ``torch`` extra: ``pip install "normlab[torch]"``.
"""

from __future__ import annotations

try:
    import torch
except ImportError as exc:  # pragma: no cover - exercised without torch only
    raise ImportError(
        'normlab.torch needs PyTorch, which is not installed; run: pip install "normlab[torch]"'
    ) from exc

from typing import Any

import numpy as np

__all__ = ["QuantLinear", "convert", "quantize"]


def quantize(t: torch.Tensor, fmt: Any, *, rounding: str = "nearest", saturate: bool = False,
             seed: int | None = None, random_bits: Any = None) -> torch.Tensor:
    """Interim bridge to the NumPy rounding (replaced by the tensor implementation)."""
    from normlab.precision import quantize as np_quantize
    from normlab.precision.random_bits import stochastic_words

    wide = torch.float64 if t.dtype == torch.float64 else torch.float32
    arr = t.detach().to("cpu", wide).numpy()
    words = None if seed is None else stochastic_words(seed, arr.shape)
    out = np_quantize(arr, fmt, rounding=rounding, saturate=saturate, random_bits=words)
    return torch.from_numpy(np.ascontiguousarray(out)).to(t.device, t.dtype)


from normlab.torch.convert import convert  # noqa: E402
from normlab.torch.nn import QuantLinear  # noqa: E402
