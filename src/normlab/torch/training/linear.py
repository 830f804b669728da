"""`QuantLinear`: a `torch.nn.Linear` whose three GEMMs run in a recipe's formats.

Contract: a `torch.nn.Linear` subclass with the same constructor (plus a keyword-only
`recipe`, see [normlab.precision.scaled.recipes][]), parameters, initialisation and call (input
`(..., K)`, output `(..., N)`, weight `(N, K)`). Forward, input-gradient and weight-gradient
GEMMs quantise their operands with the recipe's quantizers (kept in `quantizers`, one per
operand and contraction axis) and accumulate in float32 (`normlab.torch.training._gemm`).
`reset_parameters` initialises the weight and bias as `torch.nn.Linear` does and (re)builds
the recipe state, so the meta-device workflow (build under `torch.device("meta")`,
`to_empty`, `reset_parameters`) gives a usable layer; `to_empty` rebuilds the recipe state
too, for initialisers that only reset the weights (Hugging Face's `init_weights`).

Delayed scaling (`Fp8DelayedRecipe`) keeps, as module extra state (so `state_dict`
round-trips it, packed into one `uint8` tensor), an amax history `(3, L)` and a scale `(3,)`
for x, W and dy: row i is exactly an [Fp8Meta][normlab.precision.Fp8Meta] with the
recipe's settings, updated by the same functions
([record_amax][normlab.precision.scaled.scales.record_amax],
[delayed_update][normlab.precision.scaled.scales.delayed_update]). A quantisation uses the
current scale and records its amax into history slot 0 (running max). The scales update
once per step, at the first training forward of the next one: it reduces slot 0 with MAX
over the process group, computes the new scales and rolls the history, if amaxes were
recorded since the last update. A step is one training forward (and its backward) by
default, Transformer Engine's one `autocast` region per forward; inside
[training_step][normlab.torch.training.steps.training_step] it is the whole region (gradient
accumulation: one update for all micro-batches). A forward recomputed during the backward
(activation checkpointing, [recomputing][normlab.torch.training.recompute.recomputing]) updates
nothing and records nothing: it repeats the original forward with the same scales. A state
dict without the extra state (a checkpoint of the model before `convert`) loads strictly and
keeps the state.

Only a training forward ([normlab.torch.training.training_mode][]) records, updates or all-reduces
amaxes. Under `torch.autocast`, x, W and b are cast to the autocast dtype first, as
`torch.nn.Linear`'s are. `nonfinite_operands` counts inf/NaN operands in the current step.

Input that is not floating point (integer, bool, complex) goes to `torch.nn.Linear`'s own
computation, which raises as it does for an `nn.Linear`; an empty batch returns an empty
output and zero gradients; in a training forward it still takes part in the amax
collectives (amax 0, `normlab.torch.training._empty_batch`).
"""

from __future__ import annotations

from typing import Any

import torch

from normlab._validate import check_int
from normlab.precision.scaled import scales
from normlab.precision.scaled.hadamard import rht_matrix
from normlab.precision.scaled.recipes import Recipe, check_recipe
from normlab.torch.namespace import TORCH
from normlab.torch.training import _operand_ops as opaque
from normlab.torch.training._autocast import autocast_operands, autocast_region
from normlab.torch.training._empty_batch import EmptyBatchFunction
from normlab.torch.training._extra_state import layer_extra_state, load_layer_extra_state
from normlab.torch.training._gemm import ROLES, QuantLinearFunction, one_quantization
from normlab.torch.training.distributed import reduce_amax
from normlab.torch.training.nonfinite import count_nonfinite, count_nonfinite_amax
from normlab.torch.training.recompute import recomputing
from normlab.torch.training.switch import quantization_enabled
from normlab.torch.training.training_mode import is_training_forward, warn_eval_mode_training

__all__ = ["QuantLinear"]


class QuantLinear(torch.nn.Linear):
    """Linear layer $y = x W^T + b$ computed as a low-precision training recipe would.

    A `torch.nn.Linear` subclass: the same constructor, parameters (weight `(N, K)`, bias
    `(N,)`), initialisation and call, so code that looks for `torch.nn.Linear` (model
    initialisers, Hugging Face's `init_weights`) treats it as one.

    Parameters
    ----------
    in_features : int
        K, the size of the last input dimension.
    out_features : int
        N, the size of the last output dimension.
    bias : bool, optional
        Add a learnable bias. Default True.
    recipe : Recipe
        One of `normlab.torch.recipes.RECIPES` (keyword-only).
    process_group : torch.distributed.ProcessGroup or None, optional
        Group for the amax all-reduce of the per-tensor recipes; None (default) is the world
        group when `torch.distributed` is initialised, no reduction otherwise.
    seed_stream : int, optional
        Distinguishes this layer's stochastic-rounding streams (`convert` numbers the
        layers); the recipe's `seed` is added. Default 0.
    exact_gemm : bool, optional
        Keep every GEMM in float32 on the dequantised operands, for emulation bit-identical
        to the float32 path. Default False: a bfloat16 layer (input and weight) multiplies
        operands whose values bfloat16 holds exactly (the Bf16 recipe, FP8, MX, NVFP4,
        blockwise FP8 with power-of-two scales) in one bfloat16 GEMM with float32
        accumulation, per-tensor scales applied to the float32 result, at bfloat16 speed;
        its outputs differ from the float32 path by at most one bfloat16 unit in the last
        place, plus float32 accumulation error (`normlab.torch.training._bf16_gemm`). float32 layers
        always take the float32 path.
    device : torch.device or None, optional
        As for `torch.nn.Linear`.
    dtype : torch.dtype or None, optional
        As for `torch.nn.Linear`.

    Attributes
    ----------
    nonfinite_operands : torch.Tensor
        0-d int64 on the weight's device: how many operands (x, W, dy) held an inf or NaN
        since the current step began ([normlab.torch.training.nonfinite][]).
    quantizers : dict
        (operand, axis) -> the recipe's quantizer for a GEMM contracting that axis.
    one_quantization : dict
        operand -> the quantizer serving both of its GEMMs (None where they differ).

    Raises
    ------
    TypeError
        If `recipe` is not a recipe, or `exact_gemm` not a bool.
    ValueError
        If a size is not a positive integer.

    Examples
    --------
    >>> from normlab.torch.recipes import Fp8CurrentRecipe
    >>> layer = QuantLinear(4, 2, recipe=Fp8CurrentRecipe())
    >>> layer(torch.ones(3, 4)).shape
    torch.Size([3, 2])
    >>> isinstance(layer, torch.nn.Linear)
    True
    """

    _plain_class: type | None = None  # the class convert replaced (None: torch.nn.Linear)
    _steps_open = 0  # training_step regions around this layer (the outermost one counts)
    _step_started = False  # a training forward ran in the open region (scales updated)

    def __init__(self, in_features: int, out_features: int, bias: bool = True, *,
                 recipe: Recipe, process_group: Any | None = None, seed_stream: int = 0,
                 exact_gemm: bool = False, device: Any = None, dtype: Any = None) -> None:
        k = check_int(in_features, "in_features", minimum=1)
        if not isinstance(exact_gemm, bool):
            raise TypeError(f"exact_gemm must be a bool; got {exact_gemm!r}")
        self.exact_gemm = exact_gemm
        n = check_int(out_features, "out_features", minimum=1)
        # set before torch.nn.Linear.__init__, which calls reset_parameters -> _init_state
        self.recipe = check_recipe(recipe)
        # the six operand quantizers, decided by the recipe once (the GEMMs read them)
        self.quantizers = {(role, axis): self.recipe.quantizer(role, axis)
                           for role in ROLES for axis in (0, 1)}
        self.one_quantization = {role: one_quantization(self.quantizers, role)
                                 for role in ROLES}
        self.process_group = process_group
        self.seed_stream = check_int(seed_stream, "seed_stream")
        super().__init__(k, n, bias, device=device, dtype=dtype)

    def _init_state(self, device: Any) -> None:
        # Recipe state is "extra state", not buffers: DistributedDataParallel broadcasts
        # buffers from rank 0 before every forward, which would overwrite each rank's
        # unreduced amaxes (Transformer Engine keeps its fp8 metadata out of buffers too).
        r = self.recipe
        f32 = {"dtype": torch.float32, "device": device}
        self.amax_history: torch.Tensor | None = None  # 3,L  rows x, W, dy (delayed)
        self.scale: torch.Tensor | None = None  # 3  (delayed: next scales; current: last)
        self.pending = False  # amaxes recorded since the last scale update
        # counter of the stochastic-rounding streams (NVFP4): a CPU tensor that the
        # backward advances in place (traceable; reading it needs no device sync)
        self.rounding_counter = torch.zeros((), dtype=torch.int64)
        self.nonfinite_operands = torch.zeros((), dtype=torch.int64, device=device)
        if r.delayed:
            self.amax_history = torch.zeros(len(ROLES), r.amax_history_len, **f32)
        if any(q.takes_scale for q in self.quantizers.values()):
            self.scale = torch.ones(len(ROLES), **f32)  # per-tensor scales, delayed or current
        if r.hadamard_seed is not None:  # the random Hadamard transform of the wgrad inputs
            m = torch.from_numpy(rht_matrix(16, r.hadamard_seed % 2**64)).to(**f32)  # 16,16
            self.register_buffer("hadamard_matrix", m, persistent=False)

    def get_extra_state(self) -> torch.Tensor:
        """The recipe state: amax history, scales, pending flag, stochastic-rounding step.

        Packed into one `uint8` tensor (`normlab.torch.training._extra_state`) so that safetensors
        checkpoints (Hugging Face `save_pretrained`) can hold it.
        """
        return layer_extra_state(self)

    def set_extra_state(self, state: Any) -> None:
        """Load what `get_extra_state` returned: all validated first, then all applied.

        The amax history and scales pass the checks of the NumPy
        [Fp8Meta.load_state_dict][normlab.precision.Fp8Meta.load_state_dict] (scales
        finite float32 > 0, amaxes >= 0), `pending` is a bool and `rounding_step` an int
        >= 0; on an error (ValueError, TypeError naming the key) nothing has changed.
        """
        load_layer_extra_state(self, state)

    def _load_from_state_dict(self, state_dict: Any, prefix: str, local_metadata: Any,
                              strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys,
                                      unexpected_keys, error_msgs)
        key = prefix + "_extra_state"
        if key in missing_keys:  # a checkpoint of the model before convert: keep the state
            missing_keys.remove(key)

    def _apply(self, fn: Any, recurse: bool = True) -> QuantLinear:
        from_meta = self.weight.is_meta
        super()._apply(fn, recurse)
        if from_meta and not self.weight.is_meta:
            # to_empty(): meta tensors hold no values, so the state starts afresh
            self._init_state(self.weight.device)
            return self
        # follow the weight to its device; the recipe state stays float32 and is never
        # passed through fn, which may cast (module.to(torch.bfloat16) would round it)
        device = self.weight.device
        if self.amax_history is not None:
            self.amax_history = self.amax_history.to(device)
        if self.scale is not None:
            self.scale = self.scale.to(device)
        self.nonfinite_operands = self.nonfinite_operands.to(device)
        return self

    def reset_parameters(self) -> None:
        """`torch.nn.Linear`'s initialisation, then a fresh recipe state on the weight's device."""
        super().reset_parameters()
        self._init_state(self.weight.device)

    def extra_repr(self) -> str:
        """The layer's sizes, whether it has a bias, and its recipe, as `print(model)` shows.

        Returns
        -------
        str
            `in_features=..., out_features=..., bias=..., recipe=...`.
        """
        return (f"in_features={self.in_features}, out_features={self.out_features}, "
                f"bias={self.bias is not None}, recipe={self.recipe!r}")

    # --- state used by the GEMMs ------------------------------------------------------
    def reduce(self, amax: torch.Tensor) -> torch.Tensor:
        """All-reduce per-tensor amaxes with MAX when the recipe asks for it."""
        if self.recipe.reduce_amax:
            return reduce_amax(amax, self.process_group)
        return amax

    @property
    def seed(self) -> int:
        """The base of this layer's stochastic-rounding streams."""
        return int(getattr(self.recipe, "seed", 0)) * 1_000_003 + self.seed_stream

    @property
    def rounding_step(self) -> int:
        """The counter of the next stochastic rounding (advances by one per backward)."""
        return int(self.rounding_counter)

    @rounding_step.setter
    def rounding_step(self, value: int) -> None:
        self.rounding_counter.fill_(int(value))

    def operand_scale(self, t: torch.Tensor, index: int) -> torch.Tensor:
        """The 0-d float32 scale the FP8 recipes quantise operand `index` (`t`) with.

        Delayed scaling: the current scale, and amax(t) recorded in slot 0 of the history
        (in a training forward and its backward), as
        [Fp8Meta.quantize][normlab.precision.Fp8Meta.quantize]. Current scaling: the scale
        of amax(t), reduced over the group in a training forward and its backward
        ([normlab.torch.training.training_mode][]), kept in `scale`. An empty `t` has amax 0.
        """
        r = self.recipe
        assert self.scale is not None
        training = is_training_forward(self)  # the layer's mode, in forward and backward
        if t.numel() == 0:
            t_amax = torch.zeros((), dtype=torch.float32, device=t.device)
        else:
            t_amax = opaque.tensor_amax(t)
        if ROLES[index] == "dy" or not recomputing():  # the count, from the amax at hand
            count_nonfinite_amax(self.nonfinite_operands, t_amax)
        if not r.delayed:
            fmt = self.quantizers[ROLES[index], 1].fmt
            amax = t_amax.reshape(1).to(torch.float32)  # 1
            if training:
                amax = self.reduce(amax)
            self.scale[index] = r.scale_from_amax(amax[0], fmt, xp=TORCH)
            return self.scale[index]
        assert self.amax_history is not None
        # dy is quantised in the backward pass; x and W in a forward, which during a backward
        # pass is a recomputation (checkpointing) that must leave the history alone
        if training and (ROLES[index] == "dy" or not recomputing()):
            row = self.amax_history[index]  # L
            self.amax_history[index] = scales.record_amax(row, t_amax, xp=TORCH)
            self.pending = True
        return self.scale[index]

    def enter_step(self) -> None:
        """Open a [training_step][normlab.torch.training_step] region around this layer.

        Until the matching [exit_step][normlab.torch.QuantLinear.exit_step], only the
        first training forward may update the scales (the outermost region counts).
        """
        if self._steps_open == 0:
            self._step_started = False
        self._steps_open += 1

    def exit_step(self) -> None:
        """Close the region that [enter_step][normlab.torch.QuantLinear.enter_step] opened."""
        self._steps_open = max(self._steps_open - 1, 0)

    def begin_forward(self) -> None:
        """What a training forward does before it quantises: close the previous step.

        The scales update here, once per step: at every training forward by default, at the
        first one in an open [training_step][normlab.torch.training.steps.training_step] region; the
        count of non-finite operands restarts there. A forward recomputed during the
        backward pass ([recomputing][normlab.torch.training.recompute.recomputing]) belongs to the
        step of the forward it repeats and changes nothing; a forward that is not a training
        forward ([normlab.torch.training.training_mode][]) changes nothing either.
        """
        if not is_training_forward(self) or recomputing():
            return
        if not (self._steps_open and self._step_started):
            self.nonfinite_operands.zero_()
            self.update_scales()
            if self._steps_open:  # only then: no attribute write (a traced side effect) outside
                self._step_started = True

    def update_scales(self) -> None:
        """End a step of delayed scaling: reduce the amaxes, compute new scales, roll.

        Slot 0 of the history is MAX-reduced over the process group, then each operand gets
        the update of [Fp8Meta.update][normlab.precision.Fp8Meta.update] (new scale, rolled
        history). Does nothing for other recipes, or when no amax was recorded since the last
        update.
        """
        r = self.recipe
        if not r.delayed or not self.pending:
            return
        assert self.scale is not None and self.amax_history is not None
        slot0 = self.reduce(self.amax_history[:, 0].clone())  # 3
        self.amax_history[:, 0] = slot0
        # one batched update per format (the update is elementwise over the operands):
        # x and W share the forward format, dy has the backward one
        for rows, role in ((slice(0, 2), "x"), (slice(2, 3), "dy")):
            history, scale = r.delayed_update(self.amax_history[rows], self.scale[rows],
                                              self.quantizers[role, 1].fmt, xp=TORCH)
            self.amax_history[rows] = history  # 2,L or 1,L
            self.scale[rows] = scale
        self.pending = False

    # --- the call -------------------------------------------------------------------
    def _plain(self, x: torch.Tensor) -> torch.Tensor:
        """What the replaced layer computes (here `torch.nn.Linear`), errors included."""
        return torch.nn.functional.linear(x, self.weight, self.bias)

    def _gemm_weight(self) -> torch.Tensor:
        """The weight in the GEMMs' `(N, K)` layout."""
        return self.weight

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """`y = x W^T + b` with the recipe's operands, or plain when quantisation is off.

        Inside [no_quantization][normlab.torch.no_quantization], or for a non-float `x`,
        the layer is the unquantised `torch.nn.Linear` product. Otherwise the recipe's
        quantised operands are multiplied in float32 and the result is cast to the dtype
        of `x` (under `torch.autocast`, x, W and b are first cast to the autocast dtype, as
        `torch.nn.Linear`'s are); a training forward ([normlab.torch.training.training_mode][])
        records the amaxes of the step and all-reduces them where the recipe says.

        Parameters
        ----------
        x : torch.Tensor
            Input, shape (..., in_features); float32, bfloat16 or float16.

        Returns
        -------
        torch.Tensor
            Shape (..., out_features), the dtype of `x` (the autocast dtype under
            `torch.autocast`).

        Raises
        ------
        ValueError
            If the last dimension of `x` is not `in_features`.
        """
        if not x.is_floating_point() or not quantization_enabled():
            return self._plain(x)
        if x.shape[-1] != self.in_features:
            raise ValueError(f"x must have last dimension in_features={self.in_features}; "
                             f"got shape {tuple(x.shape)}")
        keep = torch.is_grad_enabled()  # a backward may follow: save its operands
        if self.scale is not None:  # recipe state or collectives: eval-mode training warns
            warn_eval_mode_training(self, x, self.weight, self.bias)
        x, w, b = autocast_operands(x, self._gemm_weight(), self.bias)
        self.begin_forward()
        x2 = x.reshape(-1, self.in_features)  # M,K
        with autocast_region(x):
            if x.numel() == 0:  # still takes part in the collectives
                y = EmptyBatchFunction.apply(x2, w, b, self, is_training_forward(self))
            else:
                if not recomputing():  # per-tensor scaled operands: in operand_scale
                    for role, t in (("x", x2), ("w", w)):
                        if not self.quantizers[role, 1].takes_scale:
                            count_nonfinite(self.nonfinite_operands, t)
                y = QuantLinearFunction.apply(x2, w, b, self, keep)  # M,N
        # a 2-D result is returned as it is, not as a view (FSDP2 warns about views)
        return y if x.dim() == 2 else y.reshape(*x.shape[:-1], self.out_features)
