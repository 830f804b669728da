r"""Experiment 2: Post-LN vs Pre-LN language models, with and without learning-rate warmup.

Xiong et al. 2020 ("On Layer Normalization in the Transformer Architecture", sections 3.2
and 4): at initialisation the gradients of the Post-LN Transformer's last layers are large,
so Adam with a large learning rate from the first step sends it somewhere it does not
recover from, and a warmup stage is needed; the Pre-LN Transformer's gradients are well
behaved, it trains without warmup and reaches results comparable to the Post-LN baseline
trained with warmup.

Setup, as the paper's (section 3.3 and appendix A.1) at a small size: a character-level
Transformer LM on the shipped prose corpus with Xiong et al.'s initialisation
(`_xiong_models.xiong_lm`: Xavier-normal weights, zero
biases, token embeddings $N(0, 1/d)$ times $\sqrt d$, learned positions $N(0, 1/d)$, the
head tied to the token table, ReLU FFN of width 2d, 4 heads), AdamW with betas 0.9/0.98 and
no weight decay, an optional linear warmup over the first fifth of the steps and a linear
decay to a tenth of the peak. Three configurations (Post-LN with and without warmup,
Pre-LN without) over several replicates at the peak learning rate PEAK_LR, Post-LN with
warmup at its own learning rate BASELINE_LR in the same replicates, and, with `--full`,
Pre-LN with warmup (shown, not judged) and an lr sweep of the three configurations.

Departures from the paper, with the reason: the model is 4 layers of width 32 trained for a
few hundred steps on about 24,000 characters (2 CPU cores, about a minute); no dropout and
no label smoothing (a short deterministic run measures the optimisation itself); the
schedule after the peak is a linear decay, not the inverse square root (the run is short).
The earlier version of this experiment used GPT-2's 0.02 embeddings without the $\sqrt d$
factor: at d = 32 the tiny inputs are drowned by the branch outputs in Pre-LN's stream, and
Pre-LN ended about 0.2 nats behind; with the paper's initialisation it does not.

PEAK_LR = 0.02 is, at seed 0, the largest swept lr at which the paper's baseline, Post-LN
with warmup, trains (2.45 and 2.24 against its best 2.19; at 0.03 it barely learns with this
initialisation). The window is narrow for a model this small: over seeds 0-9 the baseline
did not train at 0.02 in 7 of 30 runs. The comparison C4 therefore takes the baseline at
its own best lr, BASELINE_LR = 0.01, as the paper compares each placement at the learning
rate that suits it (Pre-LN without warmup at a larger one); the earlier version compared
the best over a sweep of one seed and flipped between PASS and NOT REPRODUCED with the seed.

Outcomes: a run "diverged" when its loss became NaN/inf, "stalled" when its validation loss
stays within 0.1 nat of the unigram entropy (it learned letter frequencies only), and
"trained" when it ends at least 0.2 nats below the entropy. Verdicts:

* C1 "Pre-LN trains without warmup" is the mechanism check: FAIL when a Pre-LN run without
  warmup does not train where the Post-LN baseline with warmup, same lr and replicate, does;
  INCONCLUSIVE when neither trains (the step budget shows nothing).
* C2 (Post-LN without warmup falls behind Pre-LN: the paired loss difference > 0), C3
  (warmup rescues Post-LN: Post-LN without minus with warmup > 0) and C4 ("comparable":
  Pre-LN without warmup minus the baseline at BASELINE_LR <= 0.1 nats) are the paper's
  claims, decided on the 95% t interval of the per-replicate differences
  ([normlab.lab.replicates.decide][]; a diverged or stalled run counts as the unigram
  entropy, the loss of a model that learned nothing more). The earlier fixed margins
  (each seed 0.15 nats apart) stood in for the resolution the interval now states.
  Replicates: 8 at the default size (250 steps), 10 with `--full`, 4 at `--quick` (200
  steps). Below DECIDES_FROM = 8 the claims are not decided: at 4, C3's interval cleared 0
  at seed 0 and not at seed 1, so the quick size reports C2-C4 INCONCLUSIVE at every seed,
  with their intervals.

Run k of report seed s draws from the generators `[s, k, 2]` (weights) and `[s, k, 3]`
(batches): seeds never overlap between reports. Dimension letters: T = steps, R = runs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.lab.experiments._training_stability_plots import label as _label
from normlab.lab.experiments._training_stability_plots import plot_curves, plot_sweep
from normlab.lab.experiments._xiong_models import FF_RATIO, HEADS, init_record, xiong_lm
from normlab.lab.replicates import Criterion, judged, t_interval
from normlab.lab.result import Check, ExperimentResult, Progress, Settings, Verdict
from normlab.lab.tables import markdown_table
from normlab.lab.training import (
    ADAM_BETAS,
    CharCorpus,
    TrainLog,
    load_corpus,
    single_threaded,
    train_lm,
)

__all__ = ["BASELINE_LR", "CONFIGS", "DETECTS", "NAME", "PEAK_LR", "TITLE", "run",
           "unigram_entropy"]

DETECTS = ("Pre-LN and Post-LN placements swapped in the residual block",)
NAME = "training_stability"
TITLE = "Post-LN vs Pre-LN training, with and without warmup (Xiong et al. 2020)"

PEAK_LR = 0.02  # the baseline's (Post-LN with warmup) largest working lr: module docstring
"""The peak learning rate of every judged run: the largest swept one at which the
baseline (Post-LN with warmup) trains, at seed 0 (see the module docstring)."""
FINAL_LR_FRACTION = 0.1  # the learning rate decays linearly to 10% of the peak
"""The learning rate decays linearly to this fraction of the peak."""
CONFIGS = (("post", False), ("post", True), ("pre", False), ("pre", True))  # (placement, warmup)
"""The runs (placement, warmup) of the default and full sizes; Pre-LN with warmup is
shown, not judged."""
_STALL_NATS = 0.1  # within this of the unigram entropy: only letter frequencies learned
_LEARNED_NATS = 0.2  # "trained": at least this far below the unigram entropy
DECIDES_FROM = 8
"""Replicates needed to decide C2-C4: with the quick size's 4 the warmup claim C3 came out
PASS at one seed and INCONCLUSIVE at the next, so fewer report INCONCLUSIVE at every seed."""
BASELINE_LR = 0.01  # Post-LN with warmup at its own best lr (the paper's comparison)
"""The peak learning rate of the paper's baseline, Post-LN with warmup, in the comparison
C4: at seed 0 its best swept lr (2.19 nats; 2.45 at PEAK_LR, where it trains in only about
three runs of four). Xiong et al. compare each placement at its own learning rate."""
_COMPARABLE_NATS = 0.1  # "comparable": best Pre-LN (no warmup) within this of best Post-LN+warmup
SWEEP_CONFIGS = (("post", False), ("post", True), ("pre", False))
"""The runs (placement, warmup) of the quick size and of the learning-rate
sweep: the judged ones."""


def unigram_entropy(ids: np.ndarray) -> float:
    """Entropy (nats) of the character frequencies: the loss of a model that ignores context.

    >>> round(unigram_entropy(np.array([0, 1, 0, 1])), 6) == round(float(np.log(2)), 6)
    True
    """
    p = np.bincount(ids) / ids.size
    p = p[p > 0]
    return float(-(p * np.log(p)).sum())


def _status(log: TrainLog, entropy: float) -> str:
    if log.diverged:
        return "diverged"
    return "stalled" if log.valid_loss >= entropy - _STALL_NATS else "trained"


def _sizes(settings: Settings) -> dict[str, Any]:
    keys = ("steps", "seeds", "d", "layers", "context", "batch", "lrs")
    return dict(zip(keys, settings.pick(
        (200, 4, 32, 4, 32, 16, (PEAK_LR,)),  # quick and default: the replicates' lrs only
        (250, 8, 32, 4, 32, 16, (PEAK_LR,)),
        (500, 10, 32, 4, 32, 16, (0.001, 0.003, 0.01, 0.015, 0.02, 0.03, 0.05, 0.1)),
    ), strict=True))


def _run_one(corpus: CharCorpus, sz: dict[str, Any], placement: str, warmup: bool,
             seed: tuple[int, int], lr: float, progress: Progress) -> TrainLog:
    """One training run; `seed` = (report seed, run index) names its two generators."""
    model = xiong_lm(corpus.vocab, sz["d"], sz["layers"], sz["context"], placement,
                     np.random.default_rng([*seed, 2]))
    log = train_lm(
        model, corpus, steps=sz["steps"], batch=sz["batch"], context=sz["context"],
        peak_lr=lr, warmup=sz["steps"] // 5 if warmup else 0,
        final_lr_fraction=FINAL_LR_FRACTION, rng=np.random.default_rng([*seed, 3]),
        on_step=progress.advance,
    )
    if log.diverged:  # the loop stopped early: finish this run's share of the bar
        progress.advance(sum(1 for v in log.train_loss if np.isnan(v)))
    return log


def _final(log: TrainLog) -> float:
    return math.inf if log.diverged else log.valid_loss


def measure(settings: Settings, progress: Progress) -> dict[str, Any]:
    """Seeds at PEAK_LR (4 configurations), then the lr sweep (run 0 at PEAK_LR reused)."""
    sz = _sizes(settings)
    corpus = load_corpus()
    others = [lr for lr in sz["lrs"] if lr != PEAK_LR]
    # Pre-LN with warmup is shown, not judged: only the full size runs it
    configs = CONFIGS if settings.size == "full" else SWEEP_CONFIGS
    progress.start(((len(configs) + 1) * sz["seeds"] + len(SWEEP_CONFIGS) * len(others))
                   * sz["steps"], "training stability")
    logs: dict[tuple[str, bool], list[TrainLog]] = {key: [] for key in configs}
    baseline: list[TrainLog] = []  # Post-LN with warmup at its own lr, BASELINE_LR
    for k in range(sz["seeds"]):
        for key in configs:
            logs[key].append(_run_one(corpus, sz, *key, (settings.seed, k), PEAK_LR, progress))
        baseline.append(_run_one(corpus, sz, "post", True, (settings.seed, k), BASELINE_LR,
                                 progress))
    sweep: dict[tuple[str, bool], dict[float, float]] = {}
    for key in SWEEP_CONFIGS:
        sweep[key] = {PEAK_LR: _final(logs[key][0])} if PEAK_LR in sz["lrs"] else {}
        for lr in others:  # run index 0: the same weights and batches as the seed-0 run
            sweep[key][lr] = _final(_run_one(corpus, sz, *key, (settings.seed, 0), lr, progress))
        sweep[key] = dict(sorted(sweep[key].items()))
    model = xiong_lm(corpus.vocab, sz["d"], sz["layers"], sz["context"], "pre",
                     np.random.default_rng([settings.seed, 0, 2]))  # run 0's initial weights
    return {
        "sizes": sz, "corpus": corpus, "entropy": unigram_entropy(corpus.split()[0]),
        "logs": logs, "sweep": sweep, "init": init_record(model),
        "final": {key: np.array([_final(lg) for lg in runs]) for key, runs in logs.items()},
        "baseline": np.array([_final(lg) for lg in baseline]),
    }


def _pairs(m: dict[str, Any]) -> list[tuple[str, float, float]]:
    """(where, Pre-LN no warmup, Post-LN warmup) at PEAK_LR per seed and per swept lr <= it."""
    final, sweep = m["final"], m["sweep"]
    out = [(f"lr {PEAK_LR:g} seed run {k}", float(a), float(b)) for k, (a, b) in
           enumerate(zip(final[("pre", False)], final[("post", True)], strict=True))]
    out += [(f"lr {lr:g} (sweep)", v, sweep[("post", True)][lr])
            for lr, v in sweep[("pre", False)].items() if lr < PEAK_LR]
    return out


def _c1(m: dict[str, Any]) -> tuple[bool, Verdict, str]:
    """Pre-LN without warmup trains; the mechanism check (module docstring)."""
    limit = m["entropy"] - _LEARNED_NATS
    missed = [(w, pre, post) for w, pre, post in _pairs(m) if not pre <= limit]
    if not missed:
        return True, "FAIL", ""
    broken = [w for w, _, post in missed if post <= limit]  # the baseline trained there
    if broken:
        return False, "FAIL", f"; Post-LN with warmup trained where Pre-LN did not: {broken}"
    return False, "INCONCLUSIVE", "; no configuration trained there in this step budget: " \
        + ", ".join(w for w, _, _ in missed)


def _capped(final: np.ndarray, entropy: float) -> np.ndarray:
    """Final losses with a diverged or stalled run counted as the unigram entropy.

    A model that diverged learned nothing a model of letter frequencies does not know; so
    its loss for the paired differences is that model's, not infinity.
    """
    return np.minimum(final, entropy)


def checks(m: dict[str, Any]) -> list[Check]:
    """Each criterion reads only the measured numbers `m` (see `measure`)."""
    final, entropy = m["final"], m["entropy"]
    limit = entropy - _LEARNED_NATS
    post0, post1, pre0 = (_capped(final[k], entropy) for k in
                          (("post", False), ("post", True), ("pre", False)))
    base = _capped(m["baseline"], entropy)
    pre_sweep = np.array([v for lr, v in m["sweep"][("pre", False)].items() if lr <= PEAK_LR])
    ok1, if1, note1 = _c1(m)
    n = post0.size
    pair = f"final validation loss of replicate k (its weights and batches) at lr {PEAK_LR:g}"
    src = "Xiong et al. 2020"
    return [
        Check(
            source=f"{src}, section 4",
            claim="The Pre-LN Transformer trains without learning-rate warmup.",
            criterion=f"Pre-LN without warmup: validation loss <= unigram entropy - "
            f"{_LEARNED_NATS} nats = {limit:.3f} in every replicate at lr {PEAK_LR:g} and "
            f"every swept lr <= {PEAK_LR:g}; FAIL where Post-LN with warmup (same lr, seed) "
            "trains and Pre-LN does not, INCONCLUSIVE where neither does",
            measured="valid " + ", ".join(_fmt(v) for v in final[("pre", False)]) + "; sweep "
            + ", ".join(_fmt(v) for v in pre_sweep) + note1,
            passed=ok1, values={"valid_loss": _jsonable(final[("pre", False)]),
                                "unigram_entropy": entropy},
            if_false=if1,
        ),
        judged(f"{src}, sections 3.2 and 4", "Without warmup, the Post-LN Transformer trains "
               "worse than Pre-LN or diverges.", Criterion(low=0.0),
               t_interval(post0 - pre0, "Post-LN minus Pre-LN (both without warmup), "
                          f"{pair}; a diverged run counts as the unigram entropy"),
               name="gap (nats)", measured=f"{n} replicates", decides=n >= DECIDES_FROM,
               values={"post_no_warmup": _jsonable(final[("post", False)]),
                       "pre_no_warmup": _jsonable(final[("pre", False)])}),
        judged(f"{src}, section 3.2 (Vaswani et al. 2017's warmup)", "Learning-rate warmup "
               "is what lets the Post-LN Transformer train.", Criterion(low=0.0),
               t_interval(post0 - post1, "Post-LN without warmup minus Post-LN with warmup, "
                          f"{pair}; a diverged run counts as the unigram entropy"),
               name="gain from warmup (nats)", measured=f"{n} replicates",
               decides=n >= DECIDES_FROM,
               values={"post_warmup": _jsonable(final[("post", True)]),
                       "post_no_warmup": _jsonable(final[("post", False)])}),
        judged(f"{src}, abstract and section 4", "Pre-LN without warmup reaches results "
               "comparable to Post-LN with warmup.", Criterion(high=_COMPARABLE_NATS),
               t_interval(pre0 - base, f"Pre-LN without warmup at lr {PEAK_LR:g} minus Post-LN "
                          f"with warmup at its own lr {BASELINE_LR:g}, final validation loss "
                          "of replicate k (its weights and batches); a diverged run counts "
                          "as the unigram entropy"),
               name="difference (nats)", measured=f"comparable: within {_COMPARABLE_NATS} "
               "nats or better", decides=n >= DECIDES_FROM,
               values={"pre_no_warmup": _jsonable(final[("pre", False)]),
                       "post_warmup_baseline_lr": _jsonable(m["baseline"])}),
    ]


def tables(m: dict[str, Any]) -> list[str]:
    """Validation loss per seed at PEAK_LR, and the lr sweep."""
    rows = [[_label(*key), ", ".join(_fmt(v) for v in m["final"][key]),
             ", ".join(_status(lg, m["entropy"]) for lg in runs)]
            for key, runs in m["logs"].items()]
    rows.append([f"{_label('post', True)} at its own lr {BASELINE_LR:g} (C4's baseline)",
                 ", ".join(_fmt(v) for v in m["baseline"]),
                 ", ".join("diverged" if not np.isfinite(v) else "stalled"
                           if v >= m["entropy"] - _STALL_NATS else "trained"
                           for v in m["baseline"])])
    seeds = markdown_table([f"configuration (lr {PEAK_LR:g})", "validation loss per replicate",
                            "outcome"], rows)
    lrs = sorted({lr for v in m["sweep"].values() for lr in v})
    sweep = markdown_table(["configuration", *(f"lr {lr:g}" for lr in lrs)],
                           [[_label(*key), *(_fmt(v[lr]) for lr in lrs)]
                            for key, v in m["sweep"].items()])
    return [seeds, sweep]


def _lrs(sweep: dict[tuple[str, bool], dict[float, float]]) -> str:
    return "lr " + ", ".join(f"{lr:g}" for lr in sorted({x for v in sweep.values() for x in v}))


def config(m: dict[str, Any]) -> dict[str, Any]:
    """The configuration that ran, for metrics.json: sizes, optimiser, the measured init."""
    sz = m["sizes"]
    return {
        **{k: v for k, v in sz.items() if k != "lrs"}, "lrs": list(sz["lrs"]),
        "heads": HEADS, "d_ff": FF_RATIO * sz["d"], "activation": "ReLU", "norm": "LayerNorm",
        "optimizer": f"AdamW betas {ADAM_BETAS[0]:g}/{ADAM_BETAS[1]:g}, no weight decay",
        "init": "Xavier-normal weights, zero biases, token embeddings N(0, 1/d) times "
        "sqrt(d), learned positions N(0, 1/d), head tied to the token table",
        "init_measured": m["init"], "peak_lr": PEAK_LR, "final_lr_fraction": FINAL_LR_FRACTION,
        "warmup_steps": sz["steps"] // 5, "runs": f"[seed, k] for k < {sz['seeds']}",
    }


def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Train the configurations over seeds and lrs, then judge (module docstring)."""
    with single_threaded():  # tiny arrays: threads would only wait on each other
        m = measure(settings, progress)
    sz, corpus = m["sizes"], m["corpus"]
    summary = (
        f"A {sz['layers']}-layer character-level Transformer LM (width {sz['d']}, {HEADS} "
        f"heads, ReLU FFN {FF_RATIO * sz['d']}, context {sz['context']}, batch {sz['batch']}) "
        "with Xiong et al.'s initialisation (Xavier-normal weights, zero biases, token "
        "embeddings N(0, 1/d) times sqrt(d), head tied to the token table) trained "
        f"{sz['steps']} AdamW steps (betas {ADAM_BETAS[0]:g}/{ADAM_BETAS[1]:g}) on the shipped "
        f"corpus ({corpus.ids.size} characters, {corpus.vocab} symbols): "
        f"{len(m['logs'])} configurations x {sz['seeds']} replicates at peak lr {PEAK_LR:g}, "
        f"and {_lrs(m['sweep'])} for three of them. Warmup is linear over the first "
        f"{sz['steps'] // 5} steps; every run then "
        f"decays linearly to {FINAL_LR_FRACTION:g} of the peak at the last step. The unigram "
        f"entropy {m['entropy']:.3f} nats is the loss of a model that only learned letter "
        "frequencies."
    )
    return ExperimentResult(
        name=NAME, title=TITLE, seed=settings.seed, summary=summary, checks=checks(m),
        figures={"loss_curves": plot_curves(m["logs"], m["entropy"], PEAK_LR),
                 "lr_sweep": plot_sweep(m["sweep"], m["entropy"], PEAK_LR)},
        tables=tables(m),
        metrics={
            "unigram_entropy": m["entropy"],
            "valid_loss": {_label(*k): _jsonable(v) for k, v in m["final"].items()},
            "valid_loss_baseline_lr": _jsonable(m["baseline"]),
            "outcome": {_label(*k): [_status(lg, m["entropy"]) for lg in runs]
                        for k, runs in m["logs"].items()},
            "lr_sweep": {_label(*k): {f"{lr:g}": _jsonable(np.array([v]))[0]
                                      for lr, v in by.items()} for k, by in m["sweep"].items()},
            "train_loss": {_label(*k): [_jsonable(np.asarray(lg.train_loss)) for lg in runs]
                           for k, runs in m["logs"].items()},
        },
        settings=config(m),
    )


def _fmt(v: float) -> str:
    return "diverged" if not np.isfinite(v) else f"{v:.3f}"


def _jsonable(a: np.ndarray) -> list[float | None]:
    """Floats, with None for NaN/inf (JSON has neither)."""
    return [float(v) if np.isfinite(v) else None for v in np.asarray(a, dtype=np.float64)]
