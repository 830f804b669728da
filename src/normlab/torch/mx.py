"""MX block quantisation of tensors: blocks of k elements along an axis share an E8M0 scale.

Dimension letters: R all other axes flattened, B blocks along the axis, K block_size.

Contract: :func:`normlab.precision.mx_quantize` bit for bit (elements, scale codes), on
any device: the same two scale rules (``"ocp"``: ``e = floor(log2 amax) - emax_elem``;
``"round_up"``: Transformer Engine's float32 round-up to an E8M0 code), the same special
blocks (all zeros -> code 0; a NaN -> code 255 and a NaN block; an infinity -> NaN scale
under "ocp", code 254 under "round_up"), the same MXINT8 elements and padding. The
block values are divided by their power-of-two scale exactly in float64 and rounded by
:func:`normlab.torch.quantize` with saturation, as the NumPy side does.
Rouhani et al., "Microscaling Data Formats for Deep Learning", 2023.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from normlab._validate import check_int
from normlab.precision.formats import Format
from normlab.precision.mx import _ELEM_ALIASES, _RULE_ALIASES, _RULES, _elem_emax
from normlab.torch._import import torch
from normlab.torch.formats import get_format
from normlab.torch.quantize import _check_tensor, quantize

__all__ = ["MXTensor", "mx_quantize"]

_NAN_CODE = 255


def _pow2(e: torch.Tensor) -> torch.Tensor:
    """2^e exactly as float64 for integer e in [-1022, 1023] (int64 tensor)."""
    return ((e + 1023) << 52).view(torch.float64)


@dataclass(frozen=True)
class MXTensor:
    """An MX-quantised tensor: ``elements`` (float32, x's shape, values of
    ``elem_format``, NaN in NaN blocks) and ``scale_codes`` (uint8 E8M0 codes, x's shape
    with the axis length replaced by B)."""

    elements: torch.Tensor
    scale_codes: torch.Tensor
    elem_format: Format
    block_size: int
    axis: int

    @property
    def scales(self) -> torch.Tensor:
        """The shared scales 2^(code - 127) as float32 (NaN for code 255)."""
        c = self.scale_codes.to(torch.int64)
        out = _pow2(c - 127).to(torch.float32)
        return torch.where(c == _NAN_CODE, float("nan"), out)

    def dequantize(self) -> torch.Tensor:
        """``X * P_i`` in float32, each scale repeated over its block (NaN scale -> NaN)."""
        n = self.elements.shape[self.axis]
        c = self.scale_codes.to(torch.int64).repeat_interleave(self.block_size, dim=self.axis)
        c = c.narrow(self.axis, 0, n)
        out = (self.elements.to(torch.float64) * _pow2(c - 127)).to(torch.float32)
        return torch.where(c == _NAN_CODE, float("nan"), out)


def _ocp_code(amax: torch.Tensor, emax_elem: int) -> torch.Tensor:
    """127 + floor(log2 amax) - emax_elem, clamped to >= 0; zero -> 0; > 254 or inf -> -1."""
    finite_pos = torch.isfinite(amax) & (amax > 0)
    _, ex = torch.frexp(torch.where(finite_pos, amax, 1.0))  # amax = f 2^ex, f in [0.5, 1)
    e = ex.to(torch.int64) - 1 - emax_elem
    e = torch.where(finite_pos, e.clamp(min=-127), -127)
    return torch.where(torch.isfinite(amax) & (e <= 127), e + 127, -1)


def _round_up_code(amax: torch.Tensor, elem_max: float) -> torch.Tensor:
    """Transformer Engine's float32 round-up to an E8M0 code (NumPy ``_round_up_code``)."""
    inv = torch.tensor(1.0 / elem_max, dtype=torch.float32, device=amax.device)
    v = amax.to(torch.float32) * inv  # float32 product, as TE
    bits = v.view(torch.int32)
    exponent = ((bits >> 23) & 0xFF).to(torch.int64)
    mantissa = bits & 0x7FFFFF
    bump = (mantissa > 0) & (exponent != 0xFE) & ~((exponent == 0) & (mantissa <= 0x400000))
    code = exponent + bump.to(torch.int64)
    code = torch.where(v == 0, 0, code)
    code = torch.where(torch.isinf(v), 0xFE, code)
    return torch.where(torch.isnan(v), _NAN_CODE, code)


def mx_quantize(
    t: torch.Tensor,
    elem_format: Any = "e4m3",
    *,
    block_size: int = 32,
    axis: int = -1,
    scale_rule: str = "ocp",
    pad: bool = False,
) -> MXTensor:
    """Quantise ``t`` to MX: one E8M0 scale per ``block_size`` elements along ``axis``.

    Formula: ``P_i = sat_round(V_i / 2^e)`` with e from the block amax by ``scale_rule``
    (module header; NumPy twin :func:`normlab.precision.mx_quantize`, equal bit for bit).

    Parameters
    ----------
    t : Tensor (float32/float64/bfloat16/float16) with at least one dimension
    elem_format : Format, name, torch dtype, or "int8" (MXINT8)
    block_size : int >= 1
    axis : the blocked axis
    scale_rule : "ocp" (alias "floor") or "round_up" (aliases "te", "ceil")
    pad : allow a length that is not a multiple of block_size (zero-padded blocks)

    Returns
    -------
    :class:`MXTensor` on t's device.

    Raises
    ------
    TypeError / ValueError: bad tensor, block_size, axis, rule, or an indivisible length.

    Example
    -------
    >>> q = mx_quantize(torch.tensor([1.0, 3.0, 0.3, -6.5]), "fp4", block_size=4)
    >>> q.scale_codes.tolist(), q.elements.tolist()
    ([127], [1.0, 3.0, 0.5, -6.0])
    """
    t = _check_tensor(t)
    if t.dim() < 1:
        raise ValueError(f"t must have at least one dimension; got shape {tuple(t.shape)}")
    key = elem_format.lower() if isinstance(elem_format, str) else None
    fmt = _ELEM_ALIASES[key] if key in _ELEM_ALIASES else get_format(elem_format)
    k = check_int(block_size, "block_size", minimum=1)
    ax = check_int(axis, "axis")
    if not -t.dim() <= ax < t.dim():
        raise ValueError(f"axis must be in [-{t.dim()}, {t.dim()}); got {axis}")
    ax %= t.dim()
    rule = _RULE_ALIASES.get(scale_rule.lower()) if isinstance(scale_rule, str) else None
    if rule is None:
        raise ValueError(f"scale_rule must be one of {_RULES} (aliases "
                         f"{sorted(_RULE_ALIASES)}); got {scale_rule!r}")
    n = t.shape[ax]
    if n % k and not pad:
        raise ValueError(f"x.shape[{ax}] = {n} is not a multiple of block_size = {k}; "
                         "pass pad=True to zero-pad the last block")
    nb = -(-n // k)
    moved = t.detach().to(torch.float64).movedim(ax, -1)  # ...,N
    lead = moved.shape[:-1]
    flat = moved.reshape(-1, n)  # R,N
    if nb * k != n:
        flat = torch.nn.functional.pad(flat, (0, nb * k - n))
    blocks = flat.reshape(-1, nb, k)  # R,B,K
    has_nan = torch.isnan(blocks).any(dim=-1)  # R,B
    amax = blocks.abs().amax(dim=-1)  # R,B (NaN propagates)
    if rule == "ocp":
        code = _ocp_code(amax, _elem_emax(fmt))
        bad = has_nan | (code < 0)
        code = torch.where(bad, _NAN_CODE, code)
    else:
        code = _round_up_code(torch.where(has_nan, float("nan"), amax), fmt.max)
        bad = code == _NAN_CODE
    shift = torch.where(bad, 0, code - 127)  # R,B
    scaled = blocks * _pow2(-shift)[..., None]  # R,B,K  exact: V / 2^e
    elems = quantize(scaled, fmt, saturate=True)
    elems = torch.where(bad[..., None], float("nan"), elems)
    elems32 = elems.reshape(-1, nb * k)[:, :n].to(torch.float32).reshape(*lead, n)
    return MXTensor(
        elements=elems32.movedim(-1, ax),
        scale_codes=code.to(torch.uint8).reshape(*lead, nb).movedim(-1, ax),
        elem_format=fmt,
        block_size=k,
        axis=ax,
    )
