r"""The numerics inspector: per layer and per step, where a recipe loses information.

[inspect][normlab.torch.inspect] watches the linear layers of a PyTorch model while it
trains and records, for each GEMM operand (input x, weight W, output gradient dy), how a
recipe's quantisation treats it: how much underflows to zero, how much saturates, the
signal-to-quantisation-noise ratio, the dynamic range the operand needs and the scales it
gets. Two modes:

* shadow mode (`recipe` given, one recipe or a list): the model runs unchanged and bit for
  bit as without the inspector; a copy of each operand is quantised with the recipe's
  quantizer for its role, as a converted layer's forward (x, W) or dgrad (dy) GEMM would
  quantise it, so a recipe can be judged before the model is converted;
* converted mode (`recipe=None`): the operands each converted layer
  ([QuantLinear][normlab.torch.QuantLinear]) uses, with its own recipe and, for delayed
  scaling, its own current scales.

Each record is a plain dict (and a JSON line of `path`):

* `step`, `module`, `tensor`: the optimizer step, the qualified name from
  `named_modules()`, and `"input"`, `"weight"` or `"grad_output"`;
* `recipe`, `format`: the recipe's `repr` (a constructor call) and the element format;
* `underflow`: the fraction of the nonzero finite values that become 0;
* `overflow`: the fraction of the finite values that saturate (clipped to the format's
  largest magnitude) or become non-finite;
* `sqnr_db`: $10 \log_{10}(\sum x^2 / \sum (x - q)^2)$, inf when the quantisation is exact;
* `amax`, `dynamic_range`: $\max |x|$ and $\log_2(\max |x| / \min_{x \ne 0} |x|)$ in
  binades, over the finite values;
* `worst_block_range`: the largest dynamic range within one block (block recipes);
* `scale_min`, `scale_max`: the extremes of the dequantisation multipliers over the blocks;
* `nonfinite`, `numel`, `ranks`: the fraction of NaN or infinite values of the operand
  (counted, never raised), its size, and the number of ranks its statistics sum over.

The exact definitions, edge cases included, are those of `normlab.torch.numerics._stats`.
`normlab inspect LOG.jsonl --out DIR` turns a log into a report with figures and a
recommendation (`normlab.lab.inspect_report`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch

from normlab._validate import check_int
from normlab.precision.scaled.recipes import Recipe, check_recipe
from normlab.torch.numerics._hooks import Watch, select
from normlab.torch.numerics._log import InspectLog

__all__ = ["InspectLog", "inspect"]


def _recipes(recipe: Any) -> list[Any] | None:
    if recipe is None:
        return None
    items = list(recipe) if isinstance(recipe, (list, tuple)) else [recipe]
    if not items:
        raise ValueError("recipe must be a recipe, a non-empty list of recipes or None; got []")
    for r in items:
        try:
            check_recipe(r)
        except TypeError:
            raise TypeError(f"recipe must be a training recipe of normlab.torch.recipes "
                            f"(Bf16Recipe, Fp8DelayedRecipe, Fp8CurrentRecipe, MXRecipe, "
                            f"NVFP4Recipe, BlockwiseFp8Recipe), a list of them or None; got "
                            f"{r!r}") from None
    labels = [repr(r) for r in items]
    if len(set(labels)) != len(labels):
        raise ValueError(f"recipe lists the same recipe twice: {labels}")
    return items


@contextlib.contextmanager
def inspect(model: torch.nn.Module, recipe: Recipe | Sequence[Recipe] | None, *,
            every: int = 1, path: str | os.PathLike[str] | None = None,
            modules: Sequence[str] | Callable[[torch.nn.Module, str], bool] | None = None
            ) -> Iterator[InspectLog]:
    """Record, per layer and per step, how a recipe's quantisation treats each GEMM operand.

    A context manager: inside it, the selected linear layers are watched, and the log it
    yields collects one record per (step, module, tensor, recipe) (the table of
    [InspectLog][normlab.torch.InspectLog]). Call `log.step()` once per optimizer step, after the
    backward pass. The hooks are installed for the recorded steps only: a step that is not
    recorded runs the model as it runs without the inspector. Leaving the context removes
    every hook, finishes a step left open and closes the file.

    Parameters
    ----------
    model : torch.nn.Module
        The model; its `torch.nn.Linear` layers (and Hugging Face `Conv1D`, and converted
        layers) are watched.
    recipe : Recipe, list of Recipe, or None
        Shadow mode: the recipe(s) whose quantizers judge copies of the operands (several
        recipes are compared in one run). None: converted mode, the converted layers'
        own recipes.
    every : int, optional
        Record every `every`-th step (steps 0, every, 2 every, ...). Default 1.
    path : str, os.PathLike or None, optional
        Write the records as JSON lines (Python's `json`, inf as `Infinity`), flushed after
        every recorded step. Default None (in memory only).
    modules : str, list of str, callable or None, optional
        Which layers: None (default) all; qualified names or `fnmatch` patterns; or
        `fn(module, name) -> bool`, the convention of `convert`'s `module_filter_fn`.

    Yields
    ------
    log : InspectLog
        With `step()` and `records`.

    Raises
    ------
    TypeError
        If `model` is not a module, `recipe` is not a recipe, a list of them or None, `every`
        is not an integer, or `modules` is not names or a callable.
    ValueError
        If `every` < 1, a name in `modules` matches no layer, or there is no layer to watch
        (with `recipe=None`: no converted layer).

    Notes
    -----
    The first call of a layer in a step is the one recorded (gradient accumulation: the
    first micro-batch). Shadow-mode delayed scaling keeps its own amax history, updated
    after each recorded step. NVFP4 gradients are rounded to nearest, not stochastically.
    Under `torch.distributed` (DDP) the statistics are reduced over the ranks at `step()`
    (sums of counts and powers, maxima of amax) and only rank 0 writes `path`; every rank
    must call `step()`. A converted layer's current-scaling amax reduction over ranks is
    not repeated: each rank's operand is judged with its own amax.

    Examples
    --------
    >>> import torch
    >>> from normlab.torch import NVFP4Recipe, inspect
    >>> net = torch.nn.Sequential(torch.nn.Linear(32, 16))
    >>> with inspect(net, NVFP4Recipe()) as log:
    ...     net(torch.randn(4, 32)).sum().backward()
    ...     log.step()
    >>> sorted(r["tensor"] for r in log.records)
    ['grad_output', 'input', 'weight']
    """
    if not isinstance(model, torch.nn.Module):
        raise TypeError(f"model must be a torch.nn.Module; got {type(model).__name__}")
    every = check_int(every, "every", minimum=1)
    recipes = _recipes(recipe)
    if path is not None and not isinstance(path, (str, os.PathLike)):
        raise TypeError(f"path must be a str, an os.PathLike or None; got {path!r}")
    if isinstance(modules, str):
        modules = [modules]
    if modules is not None and not (callable(modules)
                                    or isinstance(modules, Sequence | set | frozenset)):
        raise TypeError(f"modules must be None, a callable fn(module, name) or a list of names; "
                        f"got {modules!r}")
    pairs = select(model, modules, converted=recipes is None)
    log = InspectLog(every=every, path=path)
    watch = None
    try:
        watch = Watch(pairs, recipes, log)
        log.on_step = watch.set
        watch.set(log.recording)
        yield log
    finally:
        log.on_step = None  # a step() after the context installs nothing
        if watch is not None:
            watch.set(False)
        log.close()
