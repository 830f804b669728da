"""`QuantLinear`: a `torch.nn.Linear` whose three GEMMs run in a recipe's formats.

Contract: same parameters, initialisation and call as `torch.nn.Linear` (input `(..., K)`,
output `(..., N)`, weight `(N, K)`), plus a `recipe` ([normlab.precision.recipes][]).
Forward, input-gradient and weight-gradient GEMMs quantise their operands with blocks along
their contraction dimension and accumulate in float32 (`normlab.torch._gemm`); every
operand is the recipe's shared quantise step ([normlab.precision.recipe_core][]).

Delayed scaling (`Fp8DelayedRecipe`) keeps, as extra state (so `state_dict` round-trips
it), an amax history `(3, L)` and a scale `(3,)` for x, W and dy: row i is exactly an
[Fp8Meta][normlab.precision.Fp8Meta] with the recipe's settings, updated by the same
functions ([record_amax][normlab.precision.scales.record_amax],
[delayed_update][normlab.precision.scales.delayed_update]: TE 2.x's fused update by
default, `update="unfused"` for TE's other path). A quantisation uses the current scale and
records its amax into history slot 0 (running max); the first training forward after a
step reduces slot 0 with MAX over the process group, computes the new scales and rolls the
history (Transformer Engine updates its scales before the next forward in the same way).
"""

from __future__ import annotations

import math
from typing import Any

import torch

from normlab._validate import check_int
from normlab.precision import recipe_core as core
from normlab.precision import scales
from normlab.precision.hadamard import rht_matrix
from normlab.precision.recipes import (
    Fp8CurrentRecipe,
    Fp8DelayedRecipe,
    NVFP4Recipe,
    Recipe,
    check_recipe,
)
from normlab.torch import _operands as ops
from normlab.torch._gemm import ROLES, QuantLinearFunction
from normlab.torch.distributed import reduce_amax
from normlab.torch.namespace import TORCH

__all__ = ["QuantLinear"]


class QuantLinear(torch.nn.Module):
    """Linear layer ``y = x W^T + b`` computed as a low-precision training recipe would.

    Parameters
    ----------
    in_features, out_features : K and N. bias : add a learnable bias (kept in float32).
    recipe : one of :data:`normlab.torch.recipes.RECIPES` (keyword-only).
    process_group : group for the amax all-reduce of per-tensor recipes; None = the world
        group when ``torch.distributed`` is initialised (no reduction otherwise).
    seed_stream : distinguishes this layer's stochastic-rounding streams (``convert`` numbers
        the layers); the recipe's ``seed`` is added.
    device, dtype : as for ``torch.nn.Linear``.

    Raises
    ------
    TypeError : recipe is not a recipe. ValueError : non-positive sizes.

    Example
    -------
    >>> from normlab.torch.recipes import Fp8CurrentRecipe
    >>> layer = QuantLinear(4, 2, recipe=Fp8CurrentRecipe())
    >>> layer(torch.ones(3, 4)).shape
    torch.Size([3, 2])
    """

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: Recipe, process_group: Any | None = None, seed_stream: int = 0,
                 device: Any = None, dtype: Any = None) -> None:
        super().__init__()
        k = check_int(in_features, "in_features", minimum=1)
        n = check_int(out_features, "out_features", minimum=1)
        self.recipe = check_recipe(recipe)
        self.in_features, self.out_features = k, n
        self.process_group = process_group
        self.seed_stream = check_int(seed_stream, "seed_stream")
        kw = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty(n, k, **kw))  # N,K
        self.bias: torch.nn.Parameter | None
        if bias:
            self.bias = torch.nn.Parameter(torch.empty(n, **kw))  # N
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()
        self._init_state(device)

    def _init_state(self, device: Any) -> None:
        # Recipe state is "extra state", not buffers: DistributedDataParallel broadcasts
        # buffers from rank 0 before every forward, which would overwrite each rank's
        # unreduced amaxes (Transformer Engine keeps its fp8 metadata out of buffers too).
        r = self.recipe
        f32 = {"dtype": torch.float32, "device": device}
        self.amax_history: torch.Tensor | None = None  # 3,L  rows x, W, dy (delayed)
        self.scale: torch.Tensor | None = None  # 3  (delayed: next scales; current: last)
        self.pending = False  # amaxes recorded since the last scale update
        self.rounding_step = 0  # counter of the stochastic-rounding streams (NVFP4)
        if isinstance(r, Fp8DelayedRecipe):
            self.amax_history = torch.zeros(len(ROLES), r.amax_history_len, **f32)
        if isinstance(r, (Fp8DelayedRecipe, Fp8CurrentRecipe)):
            self.scale = torch.ones(len(ROLES), **f32)
        if isinstance(r, NVFP4Recipe):  # the random Hadamard transform of the recipe's seed
            m = torch.from_numpy(rht_matrix(16, r.seed % 2**64)).to(**f32)  # 16,16
            self.register_buffer("hadamard_matrix", m, persistent=False)

    def get_extra_state(self) -> dict[str, Any]:
        """The recipe state: amax history, scales, pending flag, stochastic-rounding step."""
        state: dict[str, Any] = {"pending": self.pending, "rounding_step": self.rounding_step}
        if self.amax_history is not None:
            state["amax_history"] = self.amax_history.clone()
        if self.scale is not None:
            state["scale"] = self.scale.clone()
        return state

    def set_extra_state(self, state: Any) -> None:
        """Load :meth:`get_extra_state`'s dict (validated before anything changes)."""
        mine = self.get_extra_state()
        if not isinstance(state, dict) or set(state) != set(mine):
            raise ValueError(f"extra state must be a dict with keys {sorted(mine)}; got "
                             f"{sorted(state) if isinstance(state, dict) else state!r}")
        for key in ("amax_history", "scale"):
            if key in mine and tuple(state[key].shape) != tuple(mine[key].shape):
                raise ValueError(f"extra state {key!r} must have shape "
                                 f"{tuple(mine[key].shape)}; got {tuple(state[key].shape)}")
        self.pending, self.rounding_step = bool(state["pending"]), int(state["rounding_step"])
        if self.amax_history is not None:
            self.amax_history.copy_(state["amax_history"])
        if self.scale is not None:
            self.scale.copy_(state["scale"])

    def _apply(self, fn: Any, recurse: bool = True) -> QuantLinear:
        super()._apply(fn, recurse)
        # follow the module to its device; the recipe state stays float32
        if self.amax_history is not None:
            self.amax_history = fn(self.amax_history).to(torch.float32)
        if self.scale is not None:
            self.scale = fn(self.scale).to(torch.float32)
        return self

    def reset_parameters(self) -> None:
        """``torch.nn.Linear``'s initialisation (Kaiming-uniform weight, uniform bias)."""
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            bound = 1.0 / math.sqrt(self.in_features)
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, recipe={self.recipe!r}")

    # --- state used by the GEMMs ------------------------------------------------------
    def reduce(self, amax: torch.Tensor) -> torch.Tensor:
        """All-reduce per-tensor amaxes with MAX when the recipe asks for it."""
        if getattr(self.recipe, "reduce_amax", False):
            return reduce_amax(amax, self.process_group)
        return amax

    @property
    def seed(self) -> int:
        """The base of this layer's stochastic-rounding streams."""
        return int(getattr(self.recipe, "seed", 0)) * 1_000_003 + self.seed_stream

    def next_rounding_step(self) -> int:
        """The counter of the next stochastic rounding (advances by one per backward)."""
        step = self.rounding_step
        self.rounding_step += 1
        return step

    def delayed_quantize(self, t: torch.Tensor, index: int) -> torch.Tensor:
        """Quantise with the current scale of operand `index`; record amax(t) in slot 0
        (in training), as [Fp8Meta.quantize][normlab.precision.Fp8Meta.quantize]."""
        r = self.recipe
        assert isinstance(r, Fp8DelayedRecipe)
        fmt = r.format_for("backward" if ROLES[index] == "dy" else "forward")
        assert self.scale is not None and self.amax_history is not None
        out = ops.per_tensor(t, fmt, self.scale[index])
        if self.training:
            amax = core.tensor_amax(t, xp=TORCH)
            row = self.amax_history[index]  # L
            self.amax_history[index] = scales.record_amax(row, amax, xp=TORCH)
            self.pending = True
        return out

    def current_quantize(self, t: torch.Tensor, index: int) -> torch.Tensor:
        """Quantise with the scale of amax(t), reduced over the group; keep it in `scale`."""
        r = self.recipe
        assert isinstance(r, Fp8CurrentRecipe)
        fmt = r.format_for("backward" if ROLES[index] == "dy" else "forward")
        amax = self.reduce(core.tensor_amax(t, xp=TORCH).reshape(1).to(torch.float32))  # 1
        scale = core.current_scale(t, fmt, margin=r.margin, epsilon=r.amax_epsilon,
                                   power_of_2_scales=r.power_of_2_scales, amax=amax[0],
                                   xp=TORCH)
        assert self.scale is not None
        self.scale[index] = scale
        return ops.per_tensor(t, fmt, scale)

    def update_scales(self) -> None:
        """End of a step for delayed scaling: reduce slot 0, then per operand the update of
        [Fp8Meta.update][normlab.precision.Fp8Meta.update] (new scale, rolled history)."""
        r = self.recipe
        if not isinstance(r, Fp8DelayedRecipe) or not self.pending:
            return
        assert self.scale is not None and self.amax_history is not None
        slot0 = self.reduce(self.amax_history[:, 0].clone())  # 3
        self.amax_history[:, 0] = slot0
        rows = []
        for i, role in enumerate(ROLES):
            fmt = r.format_for("backward" if role == "dy" else "forward")
            rows.append(scales.delayed_update(
                self.amax_history[i], self.scale[i], fmt.max, margin=r.margin,
                amax_compute_algo=r.amax_compute_algo, update=r.update, xp=TORCH))
        self.amax_history.copy_(torch.stack([h for h, _ in rows]))  # 3,L
        self.scale.copy_(torch.stack([s for _, s in rows]))  # 3
        self.pending = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have last dimension in_features={self.in_features}; "
                             f"got shape {tuple(x.shape)}")
        if self.training:
            self.update_scales()
        x2 = x.reshape(-1, self.in_features)  # M,K
        y = QuantLinearFunction.apply(x2, self.weight, self.bias, self)  # M,N
        return y.reshape(*x.shape[:-1], self.out_features)
