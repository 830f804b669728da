"""The `normlab bench` section for the numerics inspector's overhead (needs PyTorch).

On the model of [normlab.bench.training_model][] (float32, unconverted), one training step
inside [inspect][normlab.torch.inspect] (shadow mode, one recipe, `every=1` and
`every=10`) against the same step without it:

- correctness first: two copies of the model train 3 steps, one inside the inspector; the
  losses and parameters must be bit-identical (shadow mode changes nothing);
- time: [alternate][normlab.bench.timing.alternate] in `rounds` alternating rounds, each
  sample `every` steps long (so each inspected sample holds exactly one recorded step and
  `every - 1` steps that run without the inspector's hooks, which it installs for
  recorded steps only); the ratio is the median over rounds of
  the round's ratio, its interquartile spread beside it. Target: at most 1.15x at
  `every=10`.
"""

from __future__ import annotations

import copy
import statistics
from typing import Any

import torch

import normlab.torch as nt
from normlab.bench.table import format_seconds, render
from normlab.bench.timing import alternate, other_load
from normlab.bench.training_model import FULL, QUICK, ModelSize, Run, build_model

__all__ = ["EVERY", "TARGET_RATIO", "format_inspect", "inspect_section"]

EVERY = (1, 10)
"""The `every` settings the section times."""
TARGET_RATIO = 1.15
"""The overhead the issue aims at, inspected step over plain step, at `every=10`."""


def _identical(model: torch.nn.Module, size: ModelSize, recipe: Any) -> bool:
    """Three steps with and without the inspector give the same bits."""
    plain, watched = Run.of(copy.deepcopy(model), size), Run.of(copy.deepcopy(model), size)
    want = [plain.step() for _ in range(3)]
    with nt.inspect(watched.model, recipe) as log:
        got = []
        for _ in range(3):
            got.append(watched.step())
            log.step()
    same = [torch.equal(p, q) for p, q in zip(plain.model.parameters(),
                                               watched.model.parameters(), strict=True)]
    return got == want and all(same) and len(log.records) > 0


def inspect_section(quick: bool = False, rounds: int | None = None,
                    seed: int = 0) -> dict[str, Any]:
    """Check, then time the inspected step against the plain one (module docstring).

    Parameters
    ----------
    quick : bool, optional
        The small model of `QUICK` on one torch thread. Default False (`FULL`).
    rounds, seed
        As in [training_section][normlab.bench.training.training_section].

    Returns
    -------
    section : dict
        `info`, `rows` (one per `every`) and `ok` (bit-identical).
    """
    rounds = (2 if quick else 5) if rounds is None else max(1, int(rounds))
    size = QUICK if quick else FULL
    threads = torch.get_num_threads()
    if quick:
        torch.set_num_threads(1)
    try:
        load = other_load()
        model = build_model(size, torch.float32, seed)
        recipe = nt.NVFP4Recipe()
        ok = _identical(model, size, recipe)
        rows = []
        for every in EVERY:
            plain = Run.of(copy.deepcopy(model), size)
            watched = Run.of(copy.deepcopy(model), size)
            with nt.inspect(watched.model, recipe, every=every) as log:

                def inspected(run: Run = watched, log: Any = log) -> None:
                    run.step()
                    log.step()

                t = alternate(inspected, plain.step, rounds=rounds, inner=every,
                              warmup=every)
            rows.append({"every": every, "recipe": repr(recipe), "ratio": t.ratio,
                         "spread": t.ratio_spread,
                         # alternate's samples are per call already (one step)
                         "plain_step_s": statistics.median(t.b_s),
                         "inspected_step_s": statistics.median(t.a_s)})
        end = other_load()
        info = {"tokens": size.tokens, "width": size.width, "hidden": size.hidden,
                "blocks": size.blocks, "rounds": rounds,
                "torch_threads": torch.get_num_threads(),
                "load_average_1min": None if load is None else load[0],
                "load_average_1min_end": None if end is None else end[0]}
        return {"info": info, "rows": rows, "ok": ok}
    finally:
        torch.set_num_threads(threads)


def format_inspect(section: dict[str, Any], markdown: bool = False) -> str:
    """The section as a heading, a table and a legend.

    Parameters
    ----------
    section : dict
        The result of [inspect_section][normlab.bench.inspect_overhead.inspect_section].
    markdown
        As in [format_training][normlab.bench.training.format_training].

    Returns
    -------
    text : str
        Heading, table, the bit-identity verdict and the legend, one per line.
    """
    i = section["info"]
    head = (f"numerics inspector overhead (normlab.torch.inspect, shadow mode, NVFP4): "
            f"{i['blocks']} residual MLP blocks, tokens {i['tokens']}, width {i['width']}, "
            f"hidden {i['hidden']}, AdamW, float32; torch threads {i['torch_threads']}")
    rows = [[f"every={r['every']}", f"{r['ratio']:.2f}x ({100 * r['spread']:.0f}%)",
             format_seconds(r["inspected_step_s"]), format_seconds(r["plain_step_s"])]
            for r in section["rows"]]
    table = render(("inspected", "step ratio", "inspected step", "plain step"), rows, markdown)
    verdict = "bit-identical with and without the inspector: " + (
        "ok" if section["ok"] else "FAILED")
    legend = (f"step ratio = inspected step / plain step, median over {i['rounds']} "
              "alternating rounds of `every` steps each (interquartile spread in brackets); "
              f"target at every=10: <= {TARGET_RATIO}x")
    return "\n".join([head, table, verdict, legend])
