"""``convert``: swap every ``torch.nn.Linear`` of a model for a :class:`QuantLinear`, in place.

Contract: each replaced layer keeps its parameters (the same ``Parameter`` objects, so an
optimizer built before the swap still updates them), its device and dtype; layers for which
``skip(name, module)`` is true stay ``torch.nn.Linear`` (e.g. the LM head, which the FP8 and
NVFP4 recipes keep in 16 bits). Layers are numbered in ``named_modules`` order and the
number becomes the layer's ``seed_stream``, so stochastic rounding differs per layer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch

from normlab.torch.nn import QuantLinear
from normlab.torch.recipes import Recipe, check_recipe

__all__ = ["convert"]


def convert(model: torch.nn.Module, recipe: Recipe, *,
            skip: Callable[[str, torch.nn.Module], bool] | None = None,
            process_group: Any | None = None) -> torch.nn.Module:
    """Replace the ``torch.nn.Linear`` layers of ``model`` by ``QuantLinear(recipe)``.

    Parameters
    ----------
    model : any ``torch.nn.Module`` (a bare ``torch.nn.Linear`` cannot be swapped in place:
        wrap it, or build a ``QuantLinear`` directly).
    recipe : the training recipe (:mod:`normlab.torch.recipes`).
    skip : ``skip(qualified_name, module) -> bool``; True keeps that layer as it is.
    process_group : amax-reduction group of every new layer (None: the default group).

    Returns
    -------
    ``model`` itself, modified in place.

    Raises
    ------
    TypeError : model is not a Module, is itself a Linear, or recipe/skip is wrong.

    Example
    -------
    >>> from normlab.torch.recipes import MXRecipe
    >>> net = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 8))
    >>> net = convert(net, MXRecipe(), skip=lambda name, m: name == "2")
    >>> [type(m).__name__ for m in net]
    ['QuantLinear', 'ReLU', 'Linear']
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    if isinstance(model, torch.nn.Linear):
        raise TypeError("model is itself a torch.nn.Linear, which cannot be replaced in "
                        "place; wrap it (torch.nn.Sequential(model)) or build a QuantLinear")
    check_recipe(recipe)
    if skip is not None and not callable(skip):
        raise TypeError(f"skip must be a callable skip(name, module) -> bool; got {skip!r}")
    targets = [
        (name, m) for name, m in model.named_modules()
        if type(m) is torch.nn.Linear and not (skip is not None and skip(name, m))
    ]
    for index, (name, old) in enumerate(targets):
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, _swap(old, recipe, process_group, index))
    return model


def _swap(old: torch.nn.Linear, recipe: Recipe, group: Any | None, index: int) -> QuantLinear:
    with torch.random.fork_rng(devices=[]):  # the throw-away initialisation leaves the
        new = QuantLinear(old.in_features, old.out_features, old.bias is not None,  # RNG as is
                          recipe=recipe, process_group=group, seed_stream=index,
                          device=old.weight.device)
    # the same Parameter objects: optimizers keep working
    new.weight = cast(torch.nn.Parameter, old.weight)
    if old.bias is not None:
        new.bias = old.bias
    new.train(old.training)
    return new
