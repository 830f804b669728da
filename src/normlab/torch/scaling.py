r"""Per-tensor FP8 scaling on tensors: current scaling and delayed-scaling state (`Fp8Meta`).

Dimension letters: L amax history length.

Contract: the NumPy recipes of [normlab.precision.scaled.fp8_scaling][] bit for bit, with every
scalar kept as a 0-d tensor on the data's device (no host synchronisation). Both sides
call the same functions through their array namespace: [normlab.precision.scaled.arithmetic][]
for the quantisation and the current scale,
[delayed_update][normlab.precision.scaled.scales.delayed_update] and
[record_amax][normlab.precision.scaled.scales.record_amax] for the delayed state. This module
validates arguments and holds tensors.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from normlab._moved import renamed_arguments
from normlab._validate import check_finite_real
from normlab.precision.formats.format import Format
from normlab.precision.scaled import arithmetic as core
from normlab.precision.scaled import scales
from normlab.precision.scaled.fp8_scaling import Fp8Meta as NumpyFp8Meta
from normlab.precision.scaled.fp8_scaling import Fp8Tensor, checked_meta_state, current_scale_of
from normlab.precision.scaled.recipes import DelayedScaling
from normlab.torch._import import torch
from normlab.torch.formats import get_format
from normlab.torch.namespace import TORCH
from normlab.torch.quantize import check_tensor

__all__ = ["Fp8Meta", "Fp8Tensor", "fp8_quantize", "quantize_current_scaling"]


def _scale_tensor(scale: Any, device: torch.device) -> torch.Tensor:
    """A float32 0-d scale; Python numbers are validated (finite, > 0) on the host."""
    if isinstance(scale, torch.Tensor):
        if scale.numel() != 1 or not scale.is_floating_point():
            raise TypeError(f"scale must be a float or a one-element float tensor; got "
                            f"{scale.dtype} of shape {tuple(scale.shape)}")
        return scale.detach().reshape(()).to(device=device, dtype=torch.float32)
    with np.errstate(over="ignore"):
        s = float(np.float32(check_finite_real(scale, "scale")))
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"scale must be a finite float32 > 0; got {scale!r}")
    return torch.tensor(s, dtype=torch.float32, device=device)


def _reciprocal(s: torch.Tensor) -> torch.Tensor:
    return torch.div(torch.ones_like(s), s)  # IEEE division, float32


def _fp8_tensor(t: torch.Tensor, fmt: Format, scale: torch.Tensor) -> Fp8Tensor:
    data, inv = core.per_tensor_quantize(t, fmt, scale, xp=TORCH)
    amax = core.tensor_amax(t, xp=TORCH).to(torch.float64)
    return Fp8Tensor(data, scale.to(torch.float32), inv, fmt, amax)


@renamed_arguments(t="x")
def fp8_quantize(x: torch.Tensor, fmt: Any, scale: Any) -> Fp8Tensor:
    """`sat_round(x * scale)` with `x * scale` in float32 (float64 input: float64).

    Parameters
    ----------
    x : torch.Tensor
        float32, float64, bfloat16 or float16.
    fmt : Format, str or torch.dtype
        The FP8 format.
    scale : float or torch.Tensor
        A float (checked: finite float32 > 0) or a one-element tensor (taken as is).

    Returns
    -------
    q : Fp8Tensor
        Equal to [normlab.precision.fp8_quantize][] on `x.cpu().numpy()`.

    Examples
    --------
    >>> fp8_quantize(torch.tensor([1.0, 1000.0]), "e4m3", 1.0).data.tolist()
    [1.0, 448.0]
    """
    x = check_tensor(x)
    return _fp8_tensor(x.detach(), get_format(fmt), _scale_tensor(scale, x.device))


@renamed_arguments(t="x")
def quantize_current_scaling(x: torch.Tensor, fmt: Any = "e4m3", *, margin: int = 0,
                             amax_epsilon: float = 0.0, power_of_2_scales: bool = False,
                             axis: int | None = None) -> Fp8Tensor:
    r"""Current scaling: the scale comes from this tensor's own amax (or each slice's).

    $a = \max(\mathrm{amax}(x), \epsilon)$, $s = m_{fp8} \cdot 2^{-\mathrm{margin}} / a$
    (1 when $a$ is 0, inf or NaN), rounded down to a power of two with
    `power_of_2_scales` (Transformer Engine `Float8CurrentScaling`; NumPy twin
    [normlab.precision.quantize_current_scaling][], equal bit for bit).

    Parameters
    ----------
    x : torch.Tensor
        float32, float64, bfloat16 or float16.
    fmt : Format, str or torch.dtype, optional
        Default `"e4m3"`.
    margin : int, optional
        Default 0.
    amax_epsilon : float, optional
        Lower bound on the amax, >= 0. Default 0.
    power_of_2_scales : bool, optional
        Default False.
    axis : int or None, optional
        Reduce the amax along this axis only (kept as a size-1 dimension of the scale), as
        the NumPy twin; None (default): one scale for the tensor.

    Returns
    -------
    q : Fp8Tensor
        Data and scales on `x`'s device.

    Raises
    ------
    TypeError, ValueError
        As the NumPy twin (bad tensor, margin, amax_epsilon < 0, non-bool power flag).

    Examples
    --------
    >>> q = quantize_current_scaling(torch.tensor([0.5, -2.0]), "e4m3")
    >>> q.scale.item(), q.data.tolist()
    (224.0, [112.0, -448.0])
    """
    x, f = check_tensor(x).detach(), get_format(fmt)
    return _fp8_tensor(x, f, current_scale_of(x, f, margin, amax_epsilon, power_of_2_scales,
                                              axis=axis, xp=TORCH))


@dataclass
class Fp8Meta(NumpyFp8Meta):
    """Delayed-scaling state of one tensor on a device: amax history (L,), scale, scale_inv.

    The NumPy [Fp8Meta][normlab.precision.Fp8Meta] with tensors: a subclass of it (one
    class of delayed-scaling state: the same settings, checks, state-dict keys and
    update functions, equal bit for bit), whose state lives on a device and never leaves
    it.

    Attributes
    ----------
    recipe : DelayedScaling
        The settings (an `Fp8DelayedRecipe` works too).
    role : {"forward", "backward"}
        Picks the format under HYBRID. Default `"forward"`.
    device : torch.device, str or None
        Where the state lives (default CPU).
    amax_history : torch.Tensor
        float32, shape (L,).
    scale : torch.Tensor
        0-d float32, the scale of the next quantisation.
    scale_inv : torch.Tensor
        0-d float32, `float32(1 / scale)`.
    fmt : Format
        The FP8 format of `role`.

    Examples
    --------
    >>> from normlab.precision import DelayedScaling
    >>> meta = Fp8Meta(DelayedScaling(amax_history_len=2))
    >>> meta.quantize(torch.tensor([2.0])).data.tolist(); meta.update(); meta.scale.item()
    [2.0]
    224.0
    """

    recipe: DelayedScaling
    role: str = "forward"
    device: Any = None
    # the same state as the NumPy class, held as tensors on `device`
    amax_history: torch.Tensor = field(init=False)  # type: ignore[assignment]
    scale: torch.Tensor = field(init=False)  # type: ignore[assignment]
    scale_inv: torch.Tensor = field(init=False)  # type: ignore[assignment]
    fmt: Format = field(init=False)

    def __post_init__(self) -> None:
        super().__post_init__()  # the recipe's check and the format of the role
        dev = torch.device("cpu") if self.device is None else torch.device(self.device)
        self.amax_history = torch.zeros(self.recipe.amax_history_len, dtype=torch.float32,
                                        device=dev)  # L
        self.scale = torch.ones((), dtype=torch.float32, device=dev)
        self.scale_inv = torch.ones((), dtype=torch.float32, device=dev)

    @renamed_arguments(t="x")
    def quantize(self, x: torch.Tensor) -> Fp8Tensor:
        """Quantise with the current scale and record amax(x) into history slot 0."""
        q = fp8_quantize(x, self.fmt, self.scale)
        amax = q.amax.to(self.amax_history.device)
        self.amax_history = scales.record_amax(self.amax_history, amax, xp=TORCH)
        return q

    def update(self) -> None:
        """End of step: amax from the history, new scale and scale_inv, then roll."""
        r = self.recipe
        self.amax_history, self.scale = scales.delayed_update(
            self.amax_history, self.scale, self.fmt.max, margin=r.margin,
            amax_compute_algo=r.amax_compute_algo, update=r.update, xp=TORCH)
        self.scale_inv = _reciprocal(self.scale)

    def state_dict(self) -> dict[str, Any]:
        """The state, with the keys of the NumPy twin's `state_dict()`.

        Returns
        -------
        state : dict
            `amax_history` (float32, L), `scale`, `scale_inv` (0-d float32) as copies on
            this meta's device, and `role`, `fp8_format`, `amax_history_len` (checked on
            load).

        Examples
        --------
        >>> from normlab.precision import DelayedScaling
        >>> Fp8Meta(DelayedScaling(amax_history_len=2)).state_dict()["scale"]
        tensor(1.)
        """
        return {"amax_history": self.amax_history.clone(), "scale": self.scale.clone(),
                "scale_inv": self.scale_inv.clone(), "role": self.role,
                "fp8_format": self.recipe.fp8_format,
                "amax_history_len": int(self.recipe.amax_history_len)}

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        """Restore from `state_dict()` or the NumPy twin's; values move to this meta's device.

        Parameters
        ----------
        state : Mapping
            As the NumPy [Fp8Meta.load_state_dict][normlab.precision.Fp8Meta.load_state_dict]
            takes it (the same checks, the same errors, nothing changed on an error), with
            tensors on any device accepted beside arrays and floats.
        """
        if isinstance(state, Mapping):
            state = {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v
                     for k, v in state.items()}  # fmt: skip
        history, scale = checked_meta_state(state, self.role, self.recipe)
        dev = self.amax_history.device
        self.amax_history = torch.from_numpy(history).to(dev)
        self.scale = torch.tensor(scale, dtype=torch.float32, device=dev)
        self.scale_inv = _reciprocal(self.scale)
