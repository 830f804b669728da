"""The registry of the lab's experiments, in report order.

Contract: each name below is a module of this package that follows
[normlab.lab.result][] (`NAME`, `TITLE`, `run(settings, progress)`). Modules are
imported by name only when an experiment is run, so a module that is missing or broken
shows up as that experiment's error in the report, never as an import-time crash of the CLI.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from types import ModuleType

__all__ = ["EXPERIMENTS", "UnknownExperimentError", "load", "resolve"]

EXPERIMENTS: dict[str, str] = {
    "xiong_init": "Post-LN vs Pre-LN at initialization (Xiong et al. 2020, Lemma 2, Theorem 1)",
    "training_stability": "Post-LN vs Pre-LN training, with and without warmup",
    "update_stall": "bf16 weight updates that stall (Micikevicius 2017; Zamirai 2020)",
    "loss_scaling": "fp16 gradients and loss scaling (Micikevicius et al. 2017)",
    "invariance": "Invariance table (Ba et al. 2016, Table 1, plus RMSNorm)",
    "stats_precision": "LayerNorm statistics of float32 rows with a large offset (two-pass)",
    "batch_vs_layer": "BatchNorm vs LayerNorm: batch composition, decoding, train/eval gap",
    "dropout_stats": "Inverted dropout: mean, variance, eval identity (Srivastava et al. 2014)",
    "fp8_formats": "E4M3 vs E5M2, delayed vs current scaling (Micikevicius et al. 2022)",
    "xiong_gradients": "Gradient norm per layer at init, Post-LN vs Pre-LN (Xiong et al. Fig. 3)",
    "norm_speed": "RMSNorm vs LayerNorm forward + backward time on this CPU (Zhang & Sennrich)",
    "residual_depth": "Residual placements vs depth: model update (DeepNet), output change (Admin)",
    "lowp_training": "FP8/MXFP8/NVFP4 training recipes vs bf16 in PyTorch (needs torch)",
}
"""The registry, in report order: module name -> the one-line description that
`normlab list` prints and the lab tables (README, site) show."""


class UnknownExperimentError(ValueError):
    """An experiment name that is not in [EXPERIMENTS][normlab.lab.experiments.EXPERIMENTS]."""


def resolve(names: str | Iterable[str] | None) -> list[str]:
    """Turn a user's selection into registry names, in report order.

    `None` or `""` selects every experiment; a string is split on commas. Surrounding
    blanks are ignored and `-` may stand for `_` (`batch-vs-layer`).

    Raises
    ------
    UnknownExperimentError
        For a name not in the registry; the message lists the known names.
    """
    if names is None:
        return list(EXPERIMENTS)
    items = names.split(",") if isinstance(names, str) else list(names)
    wanted = [item.strip().replace("-", "_") for item in items if item.strip()]
    if not wanted:
        return list(EXPERIMENTS)
    unknown = [name for name in wanted if name not in EXPERIMENTS]
    if unknown:
        raise UnknownExperimentError(
            f"unknown experiment name(s): {', '.join(unknown)}; "
            f"known experiments: {', '.join(EXPERIMENTS)}"
        )
    return [name for name in EXPERIMENTS if name in wanted]


def load(name: str) -> ModuleType:
    """Import the experiment module `name` (raises ImportError if it is not there yet)."""
    (resolved,) = resolve([name])
    return importlib.import_module(f"{__name__}.{resolved}")
