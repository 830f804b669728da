"""Experiment 2: Post-LN vs Pre-LN language models, with and without learning-rate warmup.

Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture", sections 3.1
and 4): at initialisation the gradients of the Post-LN Transformer's last layers are large,
so Adam with a large learning rate from the first step sends it somewhere it does not
recover from, and a warmup stage is needed; the Pre-LN Transformer's gradients are well
behaved and it trains without warmup.

Setup: a character-level TransformerLM (LayerNorm, ReLU MLP) on the shipped prose corpus,
AdamW (betas 0.9/0.98, no weight decay) at a large peak learning rate, an optional linear
warmup over the first fifth of the steps, and a linear decay to a tenth of the peak. Four
configurations, each over several seeds: Post-LN or Pre-LN, with or without warmup. A run
"diverged" when its loss became NaN/inf, "stalled" when its validation loss stays within
0.1 nat of the unigram entropy (it learned letter frequencies only), and "trained"
otherwise. Dimension letters: T = steps, R = runs.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.lab.plotting import new_figure
from normlab.lab.result import Check, ExperimentResult, Progress, Settings
from normlab.lab.training import CharCorpus, TrainLog, load_corpus, single_threaded, train_lm
from normlab.nn import TransformerLM

__all__ = ["CONFIGS", "DETECTS", "NAME", "PEAK_LR", "TITLE", "run", "unigram_entropy"]

DETECTS = ("Pre-LN and Post-LN placements swapped in the residual block",)
NAME = "training_stability"
TITLE = "Post-LN vs Pre-LN training, with and without warmup (Xiong et al. 2020)"

PEAK_LR = 0.03  # large for Adam on this model: where Post-LN needs its warmup
FINAL_LR_FRACTION = 0.1  # the learning rate decays linearly to 10% of the peak
CONFIGS = (("post", False), ("post", True), ("pre", False), ("pre", True))  # (placement, warmup)
_STALL_NATS = 0.1  # within this of the unigram entropy: only letter frequencies learned
_LEARNED_NATS = 0.2  # "trains fine": at least this far below the unigram entropy
_GAP_NATS = 0.15  # "trains worse": at least this much above the comparison run


def unigram_entropy(ids: np.ndarray) -> float:
    """Entropy (nats) of the character frequencies: the loss of a model that ignores context.

    >>> round(unigram_entropy(np.array([0, 1, 0, 1])), 6) == round(float(np.log(2)), 6)
    True
    """
    p = np.bincount(ids) / ids.size
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def _label(placement: str, warmup: bool) -> str:
    return f"{'Post' if placement == 'post' else 'Pre'}-LN, {'warmup' if warmup else 'no warmup'}"


def _status(log: TrainLog, entropy: float) -> str:
    if log.diverged:
        return "diverged"
    return "stalled" if log.valid_loss >= entropy - _STALL_NATS else "trained"


def _sizes(settings: Settings) -> dict[str, int]:
    return dict(
        zip(
            ("steps", "seeds", "d", "layers", "context", "batch"),
            settings.pick((200, 1, 32, 4, 32, 16), (300, 3, 32, 4, 32, 16),
                          (500, 5, 32, 4, 32, 16)),
            strict=True,
        )
    )


def _run_one(corpus: CharCorpus, sz: dict[str, int], placement: str, warmup: bool, seed: int,
             progress: Progress) -> TrainLog:
    model = TransformerLM(
        corpus.vocab, sz["d"], max(1, sz["d"] // 16), sz["layers"], sz["context"],
        placement, "layer", rng=np.random.default_rng([seed, 2]), activation="relu",
    )
    return train_lm(
        model, corpus, steps=sz["steps"], batch=sz["batch"], context=sz["context"],
        peak_lr=PEAK_LR, warmup=sz["steps"] // 5 if warmup else 0,
        final_lr_fraction=FINAL_LR_FRACTION, rng=np.random.default_rng([seed, 3]),
        on_step=progress.advance,
    )


def _smooth(curve: np.ndarray, width: int = 10) -> np.ndarray:
    """Moving average over ``width`` steps (NaN after a divergence stays NaN)."""
    kernel = np.ones(width) / width
    return np.convolve(curve, kernel, mode="valid")


def _plot(logs: dict[tuple[str, bool], list[TrainLog]], entropy: float) -> Any:
    fig, ax = new_figure(width=7.5, height=4.6)
    colors = {("post", False): "tab:red", ("post", True): "tab:orange",
              ("pre", False): "tab:blue", ("pre", True): "tab:cyan"}
    for key, runs in logs.items():
        for i, log in enumerate(runs):
            curve = _smooth(np.asarray(log.train_loss))
            first = i == 0
            ax.plot(np.arange(curve.size) + 10, curve, color=colors[key],
                    alpha=1.0 if first else 0.35, lw=1.6 if first else 0.9,
                    label=_label(*key) if first else None)
    ax.axhline(entropy, color="k", ls=":", label=f"unigram entropy {entropy:.2f}")
    ax.set(xlabel="step", ylabel="training loss (nats per character, 10-step mean)",
           title=f"Character LM, AdamW peak lr {PEAK_LR:g} (faint lines: other seeds)")
    ax.legend(fontsize=8)
    return fig


def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Train the four configurations over several seeds and compare their final losses."""
    with single_threaded():  # tiny arrays: threads would only wait on each other
        return _run(settings, progress)


def _run(settings: Settings, progress: Progress) -> ExperimentResult:
    sz = _sizes(settings)
    corpus = load_corpus()
    entropy = unigram_entropy(corpus.split()[0])
    seeds = [settings.seed + k for k in range(sz["seeds"])]
    progress.start(len(CONFIGS) * len(seeds) * sz["steps"], "training stability")
    logs: dict[tuple[str, bool], list[TrainLog]] = {key: [] for key in CONFIGS}
    for seed in seeds:
        for key in CONFIGS:
            log = _run_one(corpus, sz, *key, seed, progress)
            if log.diverged:  # the loop stopped early: finish this run's share of the bar
                progress.advance(sum(1 for v in log.train_loss if np.isnan(v)))
            logs[key].append(log)
    final = {key: np.array([lg.valid_loss if not lg.diverged else np.inf for lg in runs])
             for key, runs in logs.items()}  # R per configuration; inf = diverged
    post0, post1, pre0 = final[("post", False)], final[("post", True)], final[("pre", False)]
    checks = [
        Check(
            source="Xiong et al. 2020, section 4",
            claim="The Pre-LN Transformer trains without learning-rate warmup.",
            criterion=f"Pre-LN without warmup: validation loss <= unigram entropy - "
            f"{_LEARNED_NATS} nats for every seed (entropy {entropy:.3f})",
            measured="valid " + ", ".join(f"{v:.3f}" for v in pre0),
            passed=bool(np.all(pre0 <= entropy - _LEARNED_NATS)),
            values={"valid_loss": pre0.tolist(), "unigram_entropy": entropy},
        ),
        Check(
            source="Xiong et al. 2020, sections 3.1 and 4",
            claim="At a learning rate where Pre-LN trains fine without warmup, the Post-LN "
            "Transformer without warmup trains worse or diverges.",
            criterion=f"for every seed, Post-LN without warmup diverges or ends >= {_GAP_NATS} "
            "nats above Pre-LN without warmup",
            measured="Post-LN " + ", ".join(_fmt(v) for v in post0)
            + " vs Pre-LN " + ", ".join(_fmt(v) for v in pre0),
            passed=bool(np.all(post0 >= pre0 + _GAP_NATS)),
            values={"post_no_warmup": _jsonable(post0), "pre_no_warmup": pre0.tolist()},
        ),
        Check(
            source="Xiong et al. 2020, section 3.1 (Vaswani et al. 2017's warmup)",
            claim="Learning-rate warmup is what lets the Post-LN Transformer train.",
            criterion=f"for every seed, Post-LN with warmup ends >= {_GAP_NATS} nats below "
            "Post-LN without warmup",
            measured="with warmup " + ", ".join(_fmt(v) for v in post1)
            + " vs without " + ", ".join(_fmt(v) for v in post0),
            passed=bool(np.all(post1 + _GAP_NATS <= post0)),
            values={"post_warmup": _jsonable(post1), "post_no_warmup": _jsonable(post0)},
        ),
    ]
    rows = ["| configuration | validation loss per seed | outcome |", "|---|---|---|"]
    status: dict[str, list[str]] = {}
    for key, runs in logs.items():
        status[_label(*key)] = [_status(lg, entropy) for lg in runs]
        cells = ", ".join(_fmt(v) for v in final[key])
        rows.append(f"| {_label(*key)} | {cells} | {', '.join(status[_label(*key)])} |")
    summary = (
        f"A {sz['layers']}-layer character-level Transformer LM (width {sz['d']}, context "
        f"{sz['context']}, batch {sz['batch']}) trained {sz['steps']} AdamW steps at peak "
        f"learning rate {PEAK_LR:g} on the shipped corpus ({corpus.ids.size} characters, "
        f"{corpus.vocab} symbols), seeds {seeds}. Warmup is linear over the first "
        f"{sz['steps'] // 5} steps; every run then decays linearly to {FINAL_LR_FRACTION:g} of the "
        f"peak at the last step. The unigram entropy {entropy:.3f} nats is the loss of a "
        "model that only learned letter frequencies."
    )
    return ExperimentResult(
        name=NAME, title=TITLE, seed=settings.seed, summary=summary, checks=checks,
        figures={"loss_curves": _plot(logs, entropy)},
        tables=["\n".join(rows)],
        metrics={
            "unigram_entropy": entropy,
            "valid_loss": {_label(*k): _jsonable(v) for k, v in final.items()},
            "outcome": status,
            "train_loss": {_label(*k): [_jsonable(np.asarray(lg.train_loss)) for lg in runs]
                           for k, runs in logs.items()},
        },
        settings={**sz, "peak_lr": PEAK_LR, "final_lr_fraction": FINAL_LR_FRACTION,
                  "warmup_steps": sz["steps"] // 5, "seeds": seeds},
    )


def _fmt(v: float) -> str:
    return "diverged" if not np.isfinite(v) else f"{v:.3f}"


def _jsonable(a: np.ndarray) -> list[float | None]:
    """Floats, with None for NaN/inf (JSON has neither)."""
    return [float(v) if np.isfinite(v) else None for v in np.asarray(a, dtype=np.float64)]
