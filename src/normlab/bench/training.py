"""The `normlab bench` section for emulated low-precision training (needs PyTorch).

For each recipe (Bf16, FP8 delayed, FP8 current, Blockwise FP8, MX, NVFP4) on the model of
[normlab.bench.training_model][] (2 residual MLP blocks, tokens 2048, width 512, hidden
1536, AdamW), float32 and bfloat16 models:

- correctness first: [recipe_check][normlab.bench.training_checks.recipe_check], the
  layer's forward against the NumPy recipe functions (within the float32 bound);
- step time: one converted training step over the same step of the unconverted model,
  timed with [alternate][normlab.bench.timing.alternate] in `rounds` alternating rounds
  after one warm-up step each; the ratio is the median over rounds of the round's ratio
  (robust to a busy spell, which hits both sides of a round), its interquartile spread
  beside it;
- memory: bytes saved for backward by one forward of the model
  ([saved_bytes][normlab.bench.memory.saved_bytes]: distinct storages, the model's
  parameters excluded; the loss's inputs, the same for every recipe, not counted), over
  those of the unconverted bfloat16 model; and, bfloat16 model, what its linear layers
  alone save (the tensors saved while a `torch.nn.Linear`, converted or not, runs) over
  what the unconverted model's linear layers save. The rest of the model (LayerNorm's
  input, GELU's input) saves the same bytes under every recipe, as it does under
  Transformer Engine.
- memory per token, bfloat16 model: the same counts at the section's tokens and at half
  as many, their difference over the tokens between (what does not grow with the tokens,
  quantised weight copies and scales, cancels), whole model and linear layers, over the
  unconverted model's;
- L, the plain float32 step over the plain bfloat16 step (alternating rounds): what
  bfloat16 GEMMs buy on this machine. The converted bfloat16 model multiplies in
  bfloat16 where its operands are exact in bfloat16 (`normlab.torch.training._bf16_gemm`; the
  check above is of the float32 layer, the bfloat16 path has its own tests).

Three recipes run again with activation checkpointing ("+ checkpoint": norm, fc1 and GELU
of each block recomputed in backward,
[checkpointed][normlab.bench.training_model.checkpointed]), checked first to train bit for
bit as without it ([checkpoint_check][normlab.bench.training_checks.checkpoint_check]):
the memory a recompute buys and the time it costs.

torchao's float8 emulation (`convert_to_float8_training`, `emulate=True`) on the same
models is the outside reference point: checked against its own definition, then timed and
measured alike; its row says "not installed" without torchao.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import torch

from normlab.bench.memory import saved_bytes
from normlab.bench.table import format_seconds, render
from normlab.bench.timing import alternate, other_load
from normlab.bench.training_checks import checkpoint_check, recipe_check, torchao_check
from normlab.bench.training_model import (
    FULL,
    QUICK,
    ModelSize,
    Run,
    build_model,
    checkpointed,
    convert,
    recipes,
    torchao_convert,
)

__all__ = ["CHECKPOINTED", "DTYPES", "TORCHAO", "format_training", "training_section"]

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
"""The model dtypes of the section, by the name its table shows."""
TORCHAO = "torchao float8 (emulate)"
"""The name of torchao's row."""
CHECKPOINTED = ("FP8 delayed", "MX", "NVFP4")
"""The recipes that run again with activation checkpointing (one of each step target)."""


def _saved(run: Run, linear_only: bool = False) -> int:
    """Bytes the model's forward saves for backward (the loss's own inputs not counted),
    or only its linear layers (`linear_only`)."""
    linears = [m for m in run.model.modules() if isinstance(m, torch.nn.Linear)]
    out, nbytes = saved_bytes(lambda: run.model(run.x), exclude=list(run.model.parameters()),
                              within=linears if linear_only else None)
    del out  # frees the graph and what it saved
    return nbytes


def _saved_per_token(model: torch.nn.Module, size: ModelSize,
                     linear_only: bool = False) -> float:
    """Bytes saved for backward per token: the difference between a forward of `size.tokens`
    tokens and one of half as many, over the difference in tokens, so that what does not
    grow with the tokens (quantised weight copies, scales) cancels."""
    half = replace(size, tokens=size.tokens // 2)
    full = _saved(Run.of(model, size), linear_only)
    return (full - _saved(Run.of(model, half), linear_only)) / (size.tokens - half.tokens)


def _per_token(row: dict[str, Any], model: torch.nn.Module, size: ModelSize) -> None:
    """The bfloat16 model's saved bytes per token, whole and its linear layers', into `row`."""
    row["token_bytes"] = _saved_per_token(model, size)
    row["token_linear_bytes"] = _saved_per_token(model, size, linear_only=True)


def _measure(row: dict[str, Any], convert_fn: Callable[[torch.nn.Module], torch.nn.Module],
             plain: dict[str, Run], size: ModelSize, rounds: int,
             plain_steps: dict[str, list[float]]) -> None:
    """Saved bytes and step-time ratios of `convert_fn(model)` for each dtype, into `row`;
    the unconverted steps' times are appended to `plain_steps`."""
    for name, run in plain.items():
        conv = Run.of(convert_fn(run.model), size)
        row[f"saved_{name}_bytes"] = _saved(conv)
        if name == "bf16":
            row["saved_linear_bytes"] = _saved(conv, linear_only=True)
            _per_token(row, conv.model, size)
        t = alternate(conv.step, run.step, rounds=rounds)
        row[f"{name}_ratio"], row[f"{name}_spread"] = t.ratio, t.ratio_spread
        row[f"{name}_step_s"] = statistics.median(t.a_s)
        plain_steps[name].extend(t.b_s)
        del conv


def _checkpointed(model: torch.nn.Module, recipe: Any) -> torch.nn.Module:
    return checkpointed(convert(model, recipe))


def _torchao_row(plain: dict[str, Run], size: ModelSize, rounds: int,
                 plain_steps: dict[str, list[float]]) -> dict[str, Any]:
    row: dict[str, Any] = {"recipe": TORCHAO}
    converter = torchao_convert()
    if isinstance(converter, str):
        row["status"] = converter
        return row
    try:
        row["check"] = torchao_check(converter)
    except Exception as exc:  # torchao may not run on this device or torch version
        row["status"] = f"does not run here ({type(exc).__name__}: {exc})"
        return row
    if not row["check"]["passed"]:
        row["status"] = "differs from its definition: not timed"
        return row
    row["status"] = "ok"
    _measure(row, converter, plain, size, rounds, plain_steps)
    return row


def training_section(quick: bool = False, rounds: int | None = None,
                     seed: int = 0) -> dict[str, Any]:
    """Check, time and measure every recipe on the benchmark model (module docstring).

    Parameters
    ----------
    quick : bool, optional
        The small model of `QUICK` on one torch thread (a smoke run of every code path).
        Default False: the model of `FULL` on torch's threads as set.
    rounds : int or None, optional
        Alternating rounds per ratio; None: 2 with `quick`, else 5.
    seed : int, optional
        Seed of the initial weights. Default 0.

    Returns
    -------
    section : dict
        `info` (sizes, threads, rounds, load), `rows` (one per recipe, then torchao's) and
        `ok` (every recipe's check passed).

    Examples
    --------
    >>> section = training_section(quick=True, rounds=1)  # doctest: +SKIP
    >>> section["ok"]  # doctest: +SKIP
    True
    """
    rounds = (2 if quick else 5) if rounds is None else max(1, int(rounds))
    threads = torch.get_num_threads()
    if quick:  # tiny products: a second thread only waits (and waits long on a busy machine)
        torch.set_num_threads(1)
    try:
        return _section(QUICK if quick else FULL, rounds, seed)
    finally:
        torch.set_num_threads(threads)


def _section(size: ModelSize, rounds: int, seed: int) -> dict[str, Any]:
    load = other_load()
    plain = {name: Run.of(build_model(size, dtype, seed), size) for name, dtype in DTYPES.items()}
    base: dict[str, Any] = {"recipe": "unconverted"}
    for name, run in plain.items():
        base[f"saved_{name}_bytes"] = _saved(run)
    base["saved_linear_bytes"] = _saved(plain["bf16"], linear_only=True)
    _per_token(base, plain["bf16"].model, size)
    plain_ratio = alternate(plain["fp32"].step, plain["bf16"].step, rounds=rounds)
    rows = []
    plain_steps: dict[str, list[float]] = {name: [] for name in DTYPES}
    chosen = recipes()
    for label, recipe in chosen.items():
        row: dict[str, Any] = {"recipe": label, "check": recipe_check(recipe)}
        _measure(row, partial(convert, recipe=recipe), plain, size, rounds, plain_steps)
        rows.append(row)
    for label in (name for name in CHECKPOINTED if name in chosen):
        recipe = chosen[label]
        row = {"recipe": f"{label} + checkpoint", "check": checkpoint_check(recipe)}
        _measure(row, partial(_checkpointed, recipe=recipe), plain, size, rounds,
                 plain_steps)
        rows.append(row)
    rows.append(_torchao_row(plain, size, rounds, plain_steps))
    for name in DTYPES:  # the unconverted step: median over every round of the section
        base[f"{name}_step_s"] = statistics.median(plain_steps[name])
        base[f"{name}_ratio"] = 1.0
    for r in [base, *rows]:
        for name in DTYPES:
            if f"saved_{name}_bytes" in r:
                r[f"saved_{name}_ratio"] = r[f"saved_{name}_bytes"] / base["saved_bf16_bytes"]
        for key in ("saved_linear", "token", "token_linear"):
            if f"{key}_bytes" in r:
                r[f"{key}_ratio"] = r[f"{key}_bytes"] / base[f"{key}_bytes"]
    end = other_load()
    info = {"tokens": size.tokens, "width": size.width, "hidden": size.hidden,
            "blocks": size.blocks, "rounds": rounds, "torch_threads": torch.get_num_threads(),
            "plain_fp32_over_bf16": plain_ratio.ratio,
            "plain_fp32_over_bf16_spread": plain_ratio.ratio_spread,
            "load_average_1min": None if load is None else load[0],
            "load_average_1min_end": None if end is None else end[0]}
    ok = all(r["check"]["passed"] for r in rows if r["recipe"] != TORCHAO)
    return {"info": info, "rows": [base, *rows], "ok": ok}


_COLUMNS = ("recipe", "check", "fp32 model step", "bf16 model step", "saved, fp32 model",
            "saved, bf16 model", "saved by linears, bf16", "per token, bf16",
            "per token, linears, bf16")


def _check_cell(row: dict[str, Any]) -> str:
    check = row.get("check")
    if check is None:
        return "-"
    if not check["passed"]:
        return f"FAILED ({check['max_error']:.3g})"
    return "ok, bit-identical" if check["bit_identical"] else "ok"


def _cells(row: dict[str, Any]) -> list[str]:
    if row["recipe"] == TORCHAO and row.get("status") != "ok":
        return [row["recipe"], row["status"], "-", "-", "-", "-", "-", "-", "-"]
    cells = [row["recipe"], _check_cell(row)]
    for name in DTYPES:
        ratio = f"{row[f'{name}_ratio']:.2f}x"
        cells.append(f"{ratio} ({format_seconds(row[f'{name}_step_s'])})"
                     if row["recipe"] == "unconverted" else
                     f"{ratio} ({100 * row[f'{name}_spread']:.0f}%)")
    for key in [f"saved_{name}" for name in DTYPES] + ["saved_linear"]:
        cells.append(f"{row[f'{key}_ratio']:.2f}x ({row[f'{key}_bytes'] / 2**20:.1f} MiB)")
    for key in ("token", "token_linear"):
        cells.append(f"{row[f'{key}_ratio']:.2f}x ({row[f'{key}_bytes']:.0f} B)")
    return cells


def format_training(section: dict[str, Any], markdown: bool = False) -> str:
    """The section as a heading, an aligned text (or markdown) table and its legend.

    Parameters
    ----------
    section : dict
        The result of [training_section][normlab.bench.training.training_section].
    markdown : bool, optional
        A markdown table. Default False.

    Returns
    -------
    text : str
        Heading, table and legend lines.
    """
    i = section["info"]
    loads = [i[k] for k in ("load_average_1min", "load_average_1min_end")]
    load = " -> ".join("-" if v is None else f"{v:.2f}" for v in loads)
    head = (f"emulated training (normlab.torch): {i['blocks']} residual MLP blocks, tokens "
            f"{i['tokens']}, width {i['width']}, hidden {i['hidden']}, AdamW; torch threads "
            f"{i['torch_threads']}, load average {load} (start -> end); L = plain fp32 step / "
            f"plain bf16 step = {i['plain_fp32_over_bf16']:.2f}x "
            f"({100 * i['plain_fp32_over_bf16_spread']:.0f}%)")
    legend = (f"step = converted step / unconverted step, median over {i['rounds']} "
              "alternating rounds of the round's ratio (interquartile spread in brackets; "
              "the unconverted row gives its step time); saved = bytes saved for backward "
              "by one forward of the model (distinct storages, parameters excluded) / those "
              "of the unconverted bf16 model; per token = (saved at the section's tokens - "
              "saved at half as many) / the tokens between, over the unconverted bf16 "
              "model's (weight copies and scales cancel); + checkpoint = norm, fc1 and GELU "
              "recomputed "
              "in backward (check: trains bit for bit as without); saved by linears = what "
              "the linear layers alone save / what they save unconverted, bf16 model; "
              "check = the layer's forward against the recipe's NumPy functions "
              "(torchao: against its definition), within the float32 bound")
    table = render(_COLUMNS, [_cells(r) for r in section["rows"]], markdown)
    verdict = "correctness: " + ("ok" if section["ok"] else "FAILED")
    return "\n".join([head, table, verdict, legend])
