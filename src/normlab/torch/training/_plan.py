"""What `convert` does to each linear-like layer of a model, and why: the rules in one place.

Contract: `plan(model, recipes, ...)` walks `model.named_modules()` once and returns one
`LayerDecision` per linear-like layer (`torch.nn.Linear` and its subclasses, Hugging Face's
`Conv1D`, layers converted before), in that order, changing nothing. The checks run in this
order and the first that leaves a layer alone gives the reason:

1. structure: `nn.MultiheadAttention`'s `out_proj` (the attention calls
   `F.multi_head_attention_forward` with `out_proj.weight`, never `out_proj` itself), a
   class that overrides `forward`, lazy (uninitialised) parameters;
2. `module_filter_fn(module, fqn)` returns False (torchao's convention: True converts);
3. `skip(fqn, module)` returns True (the deprecated form of 2);
4. the recipe mapping gives None, or no pattern matches the name;
5. the output layer (LM head) with a recipe other than `Bf16Recipe`, unless
   `keep_lm_head=False`.

A layer converted before is re-converted when its recipe differs and kept (with its recipe
state) when it is the same.
"""

from __future__ import annotations

import fnmatch
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from normlab.torch.recipes import Recipe
from normlab.torch.training.conv1d import QuantConv1D
from normlab.torch.training.linear import QuantLinear

__all__ = ["ConvertSummary", "LayerDecision", "hf_conv1d_class", "plan"]

ACTIONS = ("convert", "reconvert", "unchanged", "left alone")

_MHA_REASON = ("nn.MultiheadAttention passes out_proj.weight to "
               "F.multi_head_attention_forward and never calls out_proj, so a QuantLinear "
               "there would not run (its input projection is computed there too)")
_FASTPATH_NOTE = ("in eval mode without autograd nn.TransformerEncoderLayer's fused fast "
                  "path computes this layer itself; torch.backends.mha.set_fastpath_enabled("
                  "False) keeps it quantised")


@dataclass(frozen=True)
class LayerDecision:
    """What `convert` did with one linear-like layer.

    Attributes
    ----------
    name : str
        The layer's qualified name in the model (`model.get_submodule(name)`).
    kind : str
        The class name of the layer before the call.
    action : str
        `"convert"`, `"reconvert"` (a converted layer given another recipe, its recipe state
        started afresh), `"unchanged"` (already converted with this recipe) or
        `"left alone"`.
    recipe : Recipe or None
        The recipe the layer runs after the call (None: not converted).
    reason : str
        Why a layer was left alone, or a note on a converted one; empty otherwise.
    """

    name: str
    kind: str
    action: str
    recipe: Any
    reason: str = ""


@dataclass(frozen=True)
class ConvertSummary:
    """Every linear-like layer `convert` met, in `named_modules` order.

    `str(summary)` is a table of one layer per line.

    Attributes
    ----------
    layers : tuple of LayerDecision
        One entry per linear-like layer.
    """

    layers: tuple[LayerDecision, ...]

    @property
    def converted(self) -> tuple[str, ...]:
        """Names of the layers that run a recipe after the call (converted or kept)."""
        return tuple(d.name for d in self.layers if d.action != "left alone")

    @property
    def left_alone(self) -> dict[str, str]:
        """Name -> reason for each linear-like layer left as it was."""
        return {d.name: d.reason for d in self.layers if d.action == "left alone"}

    def __str__(self) -> str:
        counts = {a: sum(d.action == a for d in self.layers) for a in ACTIONS}
        head = (f"convert: {counts['convert']} converted, {counts['reconvert']} re-converted, "
                f"{counts['unchanged']} unchanged, {counts['left alone']} left alone")
        rows = [head]
        for d in self.layers:
            recipe = "" if d.recipe is None else f" -> {type(d.recipe).__name__}"
            note = f" ({d.reason})" if d.reason else ""
            rows.append(f"  {d.action:<10} {d.name}: {d.kind}{recipe}{note}")
        return "\n".join(rows)


def hf_conv1d_class() -> type | None:
    """Hugging Face's `Conv1D` class if `transformers` is imported (never imports it)."""
    module = sys.modules.get("transformers.pytorch_utils")
    cls = getattr(module, "Conv1D", None) if module is not None else None
    return cls if isinstance(cls, type) else None


def _structural_reason(module: Any, parent: torch.nn.Module | None) -> str:
    if isinstance(module, QuantLinear):
        return ""
    if isinstance(parent, torch.nn.MultiheadAttention):
        return _MHA_REASON
    conv1d = hf_conv1d_class()
    base: Any = conv1d if conv1d is not None and isinstance(module, conv1d) else torch.nn.Linear
    if type(module).forward is not base.forward:
        return f"{type(module).__name__} overrides forward(); converting would drop that code"
    if isinstance(module.weight, torch.nn.parameter.UninitializedParameter):
        return "lazy (uninitialised) parameters: run one forward before convert"
    return ""


def _output_layers(model: torch.nn.Module) -> set[int]:
    """ids of the output layers: Hugging Face's `get_output_embeddings()` and `*lm_head`."""
    found = set()
    for name, m in model.named_modules():
        get = getattr(m, "get_output_embeddings", None)
        out = get() if callable(get) else None
        if isinstance(out, torch.nn.Module):
            found.add(id(out))
        if name == "lm_head" or name.endswith(".lm_head"):
            found.add(id(m))
    return found


def _mapped(recipes: Recipe | Mapping[str, Recipe | None], name: str) -> tuple[Any, str]:
    if not isinstance(recipes, Mapping):
        return recipes, ""
    for pattern, recipe in recipes.items():
        if fnmatch.fnmatchcase(name, pattern):
            why = f"the recipe mapping gives None ({pattern!r})"
            return recipe, "" if recipe is not None else why
    return None, "no pattern of the recipe mapping matches its name"


def plan(model: torch.nn.Module, recipes: Recipe | Mapping[str, Recipe | None], *,
         module_filter_fn: Callable[[torch.nn.Module, str], bool] | None,
         skip: Callable[[str, torch.nn.Module], bool] | None,
         keep_lm_head: bool) -> list[LayerDecision]:
    """One decision per linear-like layer of `model` (arguments already validated)."""
    conv1d = hf_conv1d_class()
    outputs = _output_layers(model)
    parents = {id(c): m for m in model.modules() for c in m.children()}
    fast_path = {id(c) for m in model.modules()
                 if isinstance(m, torch.nn.TransformerEncoderLayer) for c in m.children()}
    decisions = []
    for name, m in model.named_modules():
        if not (isinstance(m, torch.nn.Linear) or (conv1d is not None and isinstance(m, conv1d))):
            continue
        recipe, reason = _choose(m, name, parents.get(id(m)), recipes, module_filter_fn, skip)
        if recipe is not None and keep_lm_head and id(m) in outputs \
                and recipe.scaled:
            recipe, reason = None, ("the output layer (LM head) stays in high precision; "
                                    "keep_lm_head=False converts it")
        kind = type(m).__name__
        if recipe is None:
            decisions.append(LayerDecision(name, kind, "left alone",
                                           getattr(m, "recipe", None), reason))
            continue
        action = "convert"
        if isinstance(m, QuantLinear):
            action = "unchanged" if m.recipe == recipe else "reconvert"
        note = _FASTPATH_NOTE if id(m) in fast_path else ""
        decisions.append(LayerDecision(name, kind, action, recipe, note))
    return decisions


def _choose(m: Any, name: str, parent: torch.nn.Module | None,
            recipes: Recipe | Mapping[str, Recipe | None],
            module_filter_fn: Callable[[torch.nn.Module, str], bool] | None,
            skip: Callable[[str, torch.nn.Module], bool] | None) -> tuple[Any, str]:
    """(recipe, "") for a layer to convert, (None, reason) for one to leave alone."""
    reason = _structural_reason(m, parent)
    if reason:
        return None, reason
    if module_filter_fn is not None and not module_filter_fn(m, name):
        return None, "module_filter_fn returned False"
    if skip is not None and skip(name, m):
        return None, "skip returned True"
    return _mapped(recipes, name)


def target_class(module: torch.nn.Module) -> type[QuantLinear]:
    """The converted class for `module`: `QuantConv1D` for `Conv1D`'s layout."""
    conv1d = hf_conv1d_class()
    if isinstance(module, QuantConv1D) or (conv1d is not None and isinstance(module, conv1d)):
        return QuantConv1D
    return QuantLinear
