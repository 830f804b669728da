r"""MX block quantisation of tensors: blocks of k elements along an axis share an E8M0 scale.

Dimension letters: B blocks along the axis, K block_size.

Contract: [normlab.precision.mx_quantize][] bit for bit (elements, scale codes), on any
device, because both run [mx_quantize_parts][normlab.precision.scaled.arithmetic.mx_quantize_parts]
(the two scale rules, the special blocks, MXINT8 and padding) through their array
namespace; this module validates arguments and holds tensors.
Rouhani et al., "Microscaling Data Formats for Deep Learning", 2023.
"""

from __future__ import annotations

from typing import Any

from normlab._moved import renamed_arguments
from normlab.precision.scaled.mx import MXTensor, mx_tensor
from normlab.precision.scaled.recipe_formats import mx_element_format
from normlab.torch._import import torch
from normlab.torch.formats import get_format
from normlab.torch.namespace import TORCH
from normlab.torch.quantize import check_tensor

__all__ = ["MXTensor", "mx_quantize"]


@renamed_arguments(t="x")
def mx_quantize(
    x: torch.Tensor,
    elem_format: Any = "e4m3",
    *,
    block_size: int = 32,
    axis: int = -1,
    scale_rule: str = "ocp",
    pad: bool = False,
) -> MXTensor:
    r"""Quantise `x` to MX: one E8M0 scale per `block_size` elements along `axis`.

    $P_i = \mathrm{sat\_round}(V_i / 2^e)$ with e from the block amax by `scale_rule`
    (NumPy twin [normlab.precision.mx_quantize][], equal bit for bit).

    Parameters
    ----------
    x : torch.Tensor
        float32, float64, bfloat16 or float16, at least one dimension.
    elem_format : Format, str or torch.dtype, optional
        The element format, or `"int8"` for MXINT8. Default `"e4m3"`.
    block_size : int, optional
        >= 1. Default 32.
    axis : int, optional
        The blocked axis. Default -1.
    scale_rule : str, optional
        `"ocp"` (alias `"floor"`) or `"round_up"` (aliases `"te"`, `"ceil"`).
    pad : bool, optional
        Allow a length that is not a multiple of `block_size` (zero-padded blocks).

    Returns
    -------
    q : MXTensor
        On `x`'s device.

    Raises
    ------
    TypeError, ValueError
        A bad tensor, block_size, axis or rule, or an indivisible length.

    Examples
    --------
    >>> q = mx_quantize(torch.tensor([1.0, 3.0, 0.3, -6.5]), "fp4", block_size=4)
    >>> q.scale_codes.tolist(), q.elements.tolist()
    ([127], [1.0, 3.0, 0.5, -6.0])
    """
    x = check_tensor(x)
    if x.dim() < 1:
        raise ValueError(f"x must have at least one dimension; got shape {tuple(x.shape)}")
    fmt = (mx_element_format(elem_format) if isinstance(elem_format, str)
           else get_format(elem_format))
    return mx_tensor(x.detach(), fmt, block_size, axis, scale_rule, pad, xp=TORCH)
