"""A layer's recipe state as one tensor, so that every checkpoint format can hold it.

Contract: [pack_extra_state][normlab.torch.training._extra_state.pack_extra_state] turns a dict of
tensors and Python scalars into one 1-D `uint8` CPU tensor (the bytes `torch.save` writes);
[unpack_extra_state][normlab.torch.training._extra_state.unpack_extra_state] reads it back with
`torch.load(weights_only=True)` (no arbitrary pickles) and passes a dict through unchanged,
so checkpoints written before the packing still load.

Why one tensor: `Module.get_extra_state` may return any object for `torch.save`, but
Hugging Face's `save_pretrained` writes safetensors, which hold tensors only (a dict fails
with `'dict' object has no attribute 'device'`), and `from_pretrained` calls
`set_extra_state` with the tensor it read. An integer tensor is also left alone by the dtype
casts of `from_pretrained(dtype=...)` and `Module.to(dtype)`, which would round float32
amaxes held in a floating tensor.
"""

from __future__ import annotations

import io
from typing import Any

import numpy as np
import torch

from normlab.precision.scaled.fp8_scaling import checked_amax_history, checked_scales

__all__ = ["checked_extra_state", "layer_extra_state", "load_layer_extra_state",
           "pack_extra_state", "unpack_extra_state"]


def pack_extra_state(state: dict[str, Any]) -> torch.Tensor:
    """One 1-D `uint8` CPU tensor holding `state` (tensors are copied to the CPU first)."""
    cpu = {k: v.detach().cpu() if isinstance(v, torch.Tensor) else v for k, v in state.items()}
    buf = io.BytesIO()
    torch.save(cpu, buf)
    return torch.from_numpy(np.frombuffer(buf.getvalue(), dtype=np.uint8).copy())  # bytes


def unpack_extra_state(state: Any) -> Any:
    """The dict [pack_extra_state][normlab.torch.training._extra_state.pack_extra_state] packed.

    A dict is returned as it is (the unpacked form of older checkpoints); anything else
    that is not a 1-D `uint8` tensor is returned unchanged too, for the caller's validation
    to reject with its own message.
    """
    if not (isinstance(state, torch.Tensor) and state.dtype == torch.uint8 and state.dim() == 1):
        return state
    data = state.detach().cpu().numpy().tobytes()
    return torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)


def checked_extra_state(state: dict[str, Any],
                        shapes: dict[str, tuple[int, ...]]) -> dict[str, Any]:
    """A training layer's unpacked extra state, validated whole before anything is applied.

    `amax_history` and `scale` (where `shapes` names them, with their shapes) get the
    checks of the NumPy [Fp8Meta][normlab.precision.Fp8Meta]'s load (amaxes >= 0; scales
    finite float32 > 0) and come back as float32 NumPy arrays; `pending` must be a bool
    and `rounding_step` an int >= 0. ValueError or TypeError names the key at fault.
    """
    pending, step = state["pending"], state["rounding_step"]
    if not isinstance(pending, (bool, np.bool_)):
        raise TypeError(f"extra state 'pending' must be a bool; got {pending!r}")
    if isinstance(step, (bool, np.bool_)) or not isinstance(step, (int, np.integer)) or step < 0:
        raise ValueError(f"extra state 'rounding_step' must be an int >= 0; got {step!r}")
    out: dict[str, Any] = {"pending": bool(pending), "rounding_step": int(step)}
    arrays = {k: v.detach().cpu().numpy() if isinstance(v, torch.Tensor) else v
              for k, v in state.items() if k in shapes}
    if "amax_history" in shapes:
        out["amax_history"] = checked_amax_history(
            arrays["amax_history"], "extra state 'amax_history'", shapes["amax_history"])
    if "scale" in shapes:
        scale = checked_scales(arrays["scale"], "extra state 'scale'")
        if scale.shape != shapes["scale"]:
            raise ValueError(f"extra state 'scale' must have shape {shapes['scale']}; got "
                             f"{scale.shape}")
        out["scale"] = scale
    return out


def layer_extra_state(layer: Any) -> torch.Tensor:
    """A `QuantLinear`'s recipe state (pending flag, stochastic-rounding step, amax history
    and scales where it has them), packed."""
    state: dict[str, Any] = {"pending": layer.pending, "rounding_step": layer.rounding_step}
    if layer.amax_history is not None:
        state["amax_history"] = layer.amax_history.clone()
    if layer.scale is not None:
        state["scale"] = layer.scale.clone()
    return pack_extra_state(state)


def load_layer_extra_state(layer: Any, state: Any) -> None:
    """Load what `layer_extra_state` packed into `layer`: all checked, then all applied."""
    state = unpack_extra_state(state)
    mine = unpack_extra_state(layer_extra_state(layer))
    if not isinstance(state, dict) or set(state) != set(mine):
        raise ValueError(f"extra state must be a dict with keys {sorted(mine)}; got "
                         f"{sorted(state) if isinstance(state, dict) else state!r}")
    values = checked_extra_state(state, {k: tuple(v.shape) for k, v in mine.items()
                                         if isinstance(v, torch.Tensor)})
    layer.pending, layer.rounding_step = values["pending"], values["rounding_step"]
    for key in ("amax_history", "scale"):
        held = getattr(layer, key)
        if held is not None:
            held.copy_(torch.from_numpy(values[key]))
