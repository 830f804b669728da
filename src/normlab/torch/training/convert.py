"""`convert` and `unconvert`: swap a model's linear layers for recipe layers and back, in place.

Contract: `convert` replaces each `torch.nn.Linear` (and subclass that keeps `Linear`'s
forward) by a [QuantLinear][normlab.torch.QuantLinear] and each Hugging Face `Conv1D`
(GPT-2) by a [QuantConv1D][normlab.torch.training.conv1d.QuantConv1D]. Each new layer keeps the
*same* `Parameter` objects (so an optimizer built before the swap still updates them, and
the checkpoint keys and shapes stay), its device, dtype and train/eval mode, and
initialises nothing: the conversion draws nothing from PyTorch's random generator, and on
the meta device it allocates nothing. Layers are numbered in `named_modules` order among
those converted by the call; the number becomes the layer's `seed_stream`, so stochastic
rounding differs per layer. Which layers are converted, and why the others are not, is
decided by the rules of `normlab.torch.training._plan` and reported in a
[ConvertSummary][normlab.torch.training.convert.ConvertSummary] (logged, and returned on request).
`unconvert` puts back the classes `convert` replaced, with the same Parameters; the recipe
state is dropped.
"""

from __future__ import annotations

import fnmatch
import logging
import warnings
from collections.abc import Callable, Mapping
from typing import Any, Literal, overload

import torch

from normlab.torch.recipes import Recipe, check_recipe
from normlab.torch.training._plan import (
    ConvertSummary,
    LayerDecision,
    hf_conv1d_class,
    plan,
    target_class,
)
from normlab.torch.training.conv1d import QuantConv1D
from normlab.torch.training.linear import QuantLinear

__all__ = ["ConvertSummary", "LayerDecision", "UnmatchedPatternWarning", "convert", "unconvert"]

logger = logging.getLogger(__name__)
_STRUCTURAL = ("nn.MultiheadAttention", "overrides forward", "lazy")


@overload
def convert(model: torch.nn.Module, recipe: Recipe | Mapping[str, Recipe | None], *,
            module_filter_fn: Callable[[torch.nn.Module, str], bool] | None = ...,
            keep_lm_head: bool = ..., process_group: Any | None = ...,
            skip: Callable[[str, torch.nn.Module], bool] | None = ...,
            exact_gemm: bool = ...,
            return_summary: Literal[False] = ..., strict: bool = ...) -> torch.nn.Module: ...
@overload
def convert(model: torch.nn.Module, recipe: Recipe | Mapping[str, Recipe | None], *,
            module_filter_fn: Callable[[torch.nn.Module, str], bool] | None = ...,
            keep_lm_head: bool = ..., process_group: Any | None = ...,
            skip: Callable[[str, torch.nn.Module], bool] | None = ...,
            exact_gemm: bool = ...,
            return_summary: Literal[True],
            strict: bool = ...) -> tuple[torch.nn.Module, ConvertSummary]: ...


def convert(model: torch.nn.Module, recipe: Recipe | Mapping[str, Recipe | None], *,
            module_filter_fn: Callable[[torch.nn.Module, str], bool] | None = None,
            keep_lm_head: bool = True, process_group: Any | None = None,
            skip: Callable[[str, torch.nn.Module], bool] | None = None,
            exact_gemm: bool = False, return_summary: bool = False,
            strict: bool = False) -> Any:
    """Replace the linear layers of `model` by recipe layers, in place.

    Converted: `torch.nn.Linear` and its subclasses that keep its `forward`
    (`NonDynamicallyQuantizableLinear`), Hugging Face's `Conv1D` (GPT-2; its `(K, N)`
    weight keeps its layout) and, with another recipe, layers converted before. Left alone,
    with the reason in the summary: `nn.MultiheadAttention`'s `out_proj` (the attention
    never calls it), subclasses that override `forward`, lazy layers, layers the filter,
    the mapping or the LM-head rule exclude.

    Parameters
    ----------
    model : torch.nn.Module
        Any module that contains the layers (a bare `torch.nn.Linear` cannot be swapped in
        place: wrap it, or build a `QuantLinear` directly).
    recipe : Recipe or Mapping[str, Recipe or None]
        The training recipe of every layer, or a mapping from `fnmatch` patterns of
        qualified names to recipes: the first pattern that matches a layer's name gives its
        recipe; None, or no matching pattern, leaves the layer alone. Example:
        `{"*.mlp.*": NVFP4Recipe(), "*": Fp8CurrentRecipe()}`.
    module_filter_fn : callable or None, optional
        `module_filter_fn(module, fqn) -> bool`, torchao's convention: True converts the
        layer, False leaves it alone. None (default) converts every layer.
    keep_lm_head : bool, optional
        Leave the output layer (Hugging Face's `get_output_embeddings()`, or a layer named
        `lm_head`) in high precision when its recipe is not `Bf16Recipe`, as the FP8 and
        NVFP4 training papers do. Default True; False converts it like any other layer.
    process_group : torch.distributed.ProcessGroup or None, optional
        Amax-reduction group of every new layer (None: the default group).
    skip : callable or None, optional
        Deprecated: `skip(fqn, module) -> bool`, True leaves the layer alone. Use
        `module_filter_fn` (note its reversed sense and argument order).
    exact_gemm : bool, optional
        Every new layer's `exact_gemm` ([QuantLinear][normlab.torch.training.linear.QuantLinear]):
        True keeps a bfloat16 model's GEMMs in float32 on the dequantised operands, for
        bit-identical emulation. Default False: GEMMs in bfloat16 on operands exact in
        bfloat16, within one bfloat16 unit of the float32 path.
    return_summary : bool, optional
        Return `(model, summary)` instead of `model`. Default False. The summary is logged
        at INFO level on the `normlab.torch.training.convert` logger either way, and at WARNING
        level when a layer is left alone for a structural reason.
    strict : bool, optional
        Raise instead of warning when a pattern of a `recipe` mapping matches no linear
        layer of `model` (a misspelt name converts nothing). Default False.

    Returns
    -------
    model : torch.nn.Module
        `model` itself, modified in place.
    summary : ConvertSummary
        What happened to each linear-like layer (only with `return_summary=True`).

    Raises
    ------
    TypeError
        If `model` is not a Module or is itself a linear layer, a recipe is not a recipe,
        a mapping key is not a string, or a callable argument is not callable.
    ValueError
        With `strict=True`, if a pattern of a `recipe` mapping matches no linear layer
        (nothing is converted then).

    Warns
    -----
    DeprecationWarning
        When `skip` is given.
    UnmatchedPatternWarning
        When a pattern of a `recipe` mapping matches no linear layer (`strict=False`).

    Examples
    --------
    >>> from normlab.torch.recipes import MXRecipe
    >>> net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    >>> net, summary = convert(net, MXRecipe(), module_filter_fn=lambda m, fqn: fqn != "2",
    ...                        return_summary=True)
    >>> [type(m).__name__ for m in net]
    ['QuantLinear', 'ReLU', 'Linear']
    >>> summary.left_alone
    {'2': 'module_filter_fn returned False'}
    """
    _check_model(model)
    if isinstance(recipe, Mapping):
        for pattern, r in recipe.items():
            if not isinstance(pattern, str):
                raise TypeError(f"recipe mapping keys must be name patterns (str); got {pattern!r}")
            if r is not None:
                check_recipe(r)
    else:
        check_recipe(recipe)
    for name, fn in (("module_filter_fn", module_filter_fn), ("skip", skip)):
        if fn is not None and not callable(fn):
            raise TypeError(f"{name} must be callable or None; got {fn!r}")
    if not isinstance(keep_lm_head, bool):
        raise TypeError(f"keep_lm_head must be a bool; got {keep_lm_head!r}")
    if not isinstance(exact_gemm, bool):
        raise TypeError(f"exact_gemm must be a bool; got {exact_gemm!r}")
    if not isinstance(strict, bool):
        raise TypeError(f"strict must be a bool; got {strict!r}")
    if skip is not None:
        warnings.warn("convert(skip=...) is deprecated; use module_filter_fn(module, fqn), "
                      "which returns True for the layers to convert", DeprecationWarning,
                      stacklevel=2)
    decisions = plan(model, recipe, module_filter_fn=module_filter_fn, skip=skip,
                     keep_lm_head=keep_lm_head)
    if isinstance(recipe, Mapping):
        _check_patterns(recipe, [d.name for d in decisions], strict)
    slots = _slots(model)
    index = 0
    for d in decisions:
        if d.action in ("convert", "reconvert"):
            old = model.get_submodule(d.name)
            _replace(slots, old, _swap(old, d.recipe, process_group, index, exact_gemm))
            index += 1
    summary = ConvertSummary(tuple(decisions))
    logger.info("%s", summary)
    odd = {n: r for n, r in summary.left_alone.items() if any(s in r for s in _STRUCTURAL)}
    if odd:
        logger.warning("convert left %d linear layer(s) alone: %s", len(odd), odd)
    return (model, summary) if return_summary else model


def unconvert(model: torch.nn.Module) -> torch.nn.Module:
    """Put back the layers [convert][normlab.torch.training.convert.convert] replaced, in place.

    Each [QuantLinear][normlab.torch.training.linear.QuantLinear] becomes the class it replaced
    (`torch.nn.Linear` for one built directly; Hugging Face's `Conv1D` for a
    [QuantConv1D][normlab.torch.training.conv1d.QuantConv1D]) holding the same `Parameter` objects;
    the recipe state is dropped. The model's `state_dict` then has the keys and shapes of
    the model before `convert`.

    Parameters
    ----------
    model : torch.nn.Module
        A module containing converted layers (not itself one).

    Returns
    -------
    model : torch.nn.Module
        `model` itself, modified in place.

    Raises
    ------
    TypeError
        If `model` is not a Module or is itself a linear layer, or a replaced class cannot
        be rebuilt with `torch.nn.Linear`'s constructor arguments.

    Examples
    --------
    >>> from normlab.torch.recipes import Fp8CurrentRecipe
    >>> net = convert(torch.nn.Sequential(torch.nn.Linear(4, 4)), Fp8CurrentRecipe())
    >>> type(unconvert(net)[0]).__name__
    'Linear'
    """
    _check_model(model)
    slots = _slots(model)
    for layer in [m for m in model.modules() if isinstance(m, QuantLinear)]:
        _replace(slots, layer, _plain_layer(layer))
    return model


class UnmatchedPatternWarning(UserWarning):
    """A pattern of a `convert` recipe mapping matched no linear layer of the model."""


def _check_patterns(recipe: Mapping[str, Any], names: list[str], strict: bool) -> None:
    """Warn (or raise, `strict`) for the mapping's patterns that match none of `names`."""
    unmatched = [p for p in recipe if not any(fnmatch.fnmatchcase(n, p) for n in names)]
    if not unmatched:
        return
    shown = names[:8] + (["..."] if len(names) > 8 else [])
    msg = (f"recipe mapping pattern(s) {unmatched} match no linear layer; the layers are "
           f"{shown} (fnmatch patterns on qualified names, e.g. '*.mlp.*')")
    if strict:
        raise ValueError(msg)
    warnings.warn(msg, UnmatchedPatternWarning, stacklevel=3)


def _check_model(model: object) -> None:
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    conv1d = hf_conv1d_class()
    if isinstance(model, torch.nn.Linear) or (conv1d is not None and isinstance(model, conv1d)):
        raise TypeError(f"model is itself a {type(model).__name__}, which cannot be replaced "
                        "in place; wrap it (torch.nn.Sequential(model)) or build the layer")


def _slots(model: torch.nn.Module) -> dict[int, list[tuple[torch.nn.Module, str]]]:
    """id(child) -> every (parent, attribute) holding it: a module shared by two parents
    (listed once by `named_modules`) is replaced in both."""
    slots: dict[int, list[tuple[torch.nn.Module, str]]] = {}
    for parent in model.modules():
        for attr, child in parent._modules.items():
            if child is not None:
                slots.setdefault(id(child), []).append((parent, attr))
    return slots


def _replace(slots: dict[int, list[tuple[torch.nn.Module, str]]], old: torch.nn.Module,
             new: torch.nn.Module) -> None:
    for parent, attr in slots.pop(id(old)):
        setattr(parent, attr, new)


def _carry(old: torch.nn.Module, new: torch.nn.Module) -> None:
    """The same Parameters, mode and Hugging Face's initialised flag (its `init_weights`
    skips modules that have it, so a converted layer is not re-initialised either)."""
    new.weight = old.weight
    new.bias = old.bias
    new.train(old.training)
    if hasattr(old, "_is_hf_initialized"):
        new._is_hf_initialized = old._is_hf_initialized


def _swap(old: Any, recipe: Recipe, group: Any | None, index: int,
          exact_gemm: bool) -> QuantLinear:
    cls = target_class(old)
    k, n = (old.nx, old.nf) if cls is QuantConv1D else (old.in_features, old.out_features)
    new = cls(k, n, old.bias is not None, recipe=recipe, process_group=group,
              seed_stream=index, exact_gemm=exact_gemm, device="meta",
              dtype=old.weight.dtype)  # no storage, no init
    _carry(old, new)
    new._init_state(old.weight.device)
    new._plain_class = old._plain_class if isinstance(old, QuantLinear) else type(old)
    return new


def _plain_layer(layer: QuantLinear) -> torch.nn.Module:
    cls = getattr(layer, "_plain_class", None)
    dtype = layer.weight.dtype
    if isinstance(layer, QuantConv1D):
        if cls is None:
            from transformers.pytorch_utils import Conv1D  # a Conv1D needs transformers

            cls = Conv1D
        with torch.device("meta"):
            new = cls(layer.nf, layer.nx)
    else:
        cls = cls or torch.nn.Linear
        try:
            new = cls(layer.in_features, layer.out_features, layer.bias is not None,
                      device="meta", dtype=dtype)
        except TypeError as exc:
            raise TypeError(f"cannot rebuild {cls.__name__} with torch.nn.Linear's constructor "
                            f"arguments ({exc}); build it yourself and assign weight and bias"
                            ) from exc
    _carry(layer, new)
    return new
