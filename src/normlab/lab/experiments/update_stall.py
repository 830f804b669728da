"""Experiment 3: bf16 weight updates that stall, and the three ways out.

Micikevicius et al. 2017 ("Mixed Precision Training", section 3.1): an update smaller than
half a unit in the last place of the weight is lost when added in the weight's format
(fp16: below 2^-11 of the weight). Zamirai et al. 2020 ("Revisiting BFloat16 Training"):
with pure bf16 weights, round-to-nearest updates stall, while stochastic rounding or Kahan
(compensated) summation recover the accuracy of fp32 master weights.

Setup: least squares `min_w 0.5 ||A w - b||^2` with a known solution `w*` (d weights of
magnitude 0.5 to 2), plain gradient descent with step `lr`, the gradient evaluated at the
bf16 working weights, and four ways to store the weights: bf16 round-to-nearest, fp32
master weights with a bf16 working copy, bf16 with Kahan summation, bf16 with stochastic
rounding. The "storage floor" is the error of `w*` itself rounded to bf16, the best any
bf16 weight vector can do. Dimension letters: N = equations, D = weights, T = steps.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.lab.plotting import new_figure
from normlab.lab.result import Check, ExperimentResult, Progress, Settings
from normlab.lab.tables import markdown_table
from normlab.lab.training import single_threaded
from normlab.nn import Parameter
from normlab.precision import (
    BFLOAT16,
    FLOAT16,
    Format,
    LowPrecisionUpdater,
    MasterWeights,
    quantize,
)

__all__ = ["DETECTS", "NAME", "TITLE", "checks", "measure", "run", "swamping_ratio", "tables"]

NAME = "update_stall"
TITLE = "bf16 weight updates that stall (Micikevicius et al. 2017; Zamirai et al. 2020)"

DETECTS = (
    "master weights off (the fp32 master copy rounded to bf16 after each step)",
    "stochastic rounding replaced by round-to-nearest",
)
MODES = ("nearest", "master", "kahan", "stochastic")
"""How the weights are stored and updated: bf16 rounded to nearest, fp32 master
weights, bf16 with Kahan summation, bf16 with stochastic rounding."""
_LABELS = {
    "nearest": "bf16, round to nearest",
    "master": "fp32 master weights",
    "kahan": "bf16 + Kahan summation",
    "stochastic": "bf16 + stochastic rounding",
}
# lines that lie on top of each other (master, Kahan, SR) differ in dash and marker
_STYLE: dict[str, dict[str, Any]] = {
    "nearest": {"ls": "-", "marker": "o"},
    "master": {"ls": "-", "marker": "s", "lw": 2.5, "alpha": 0.6},
    "kahan": {"ls": "--", "marker": "^"},
    "stochastic": {"ls": ":", "marker": "x"},
}
_LRS = (0.2, 0.04, 0.008)  # each step 5x smaller than the one before
_GROWTH_MIN = 2.5  # round-to-nearest error must grow at least this much per 5x smaller step
_ABOVE_FLOOR_MIN = 5.0  # "well above the floor": at least 5x the storage floor
# master / Kahan / stochastic: the stored (last-step) weights within 2x the floor. Why 2: a
# weight w*_i at fraction f of the way between its bf16 neighbours has squared error
# min(f, 1-f)^2 ulp^2 when rounded to nearest (mean 1/12 over f), and (f^2 + (1-f)^2)/2
# (mean 1/3) when it sits on either neighbour by a fair coin, so a method that ends on a
# bf16 neighbour of w*, not necessarily the nearest, has RMS error sqrt(4) = 2x the floor;
# SR and Kahan lean towards the nearer neighbour, so their expected ratio is below 2.
_WITHIN_FLOOR = 2.0
_TAIL = 0.25  # also reported: the error of the weights averaged over the last quarter


def swamping_ratio(fmt: Format, x: float = 1.0) -> int:
    """The smallest power-of-two ratio `r` at which `x + x / r` rounds back to `x`.

    `fl(x + y) == x` once `|y|` is at most half a unit in the last place of `x`; for a
    power of two `x` and `m` mantissa bits that is `y = x 2^-(m+1)` (a tie, rounded to
    the even neighbour `x`), so fp16 (m = 10) gives 2048 and bf16 (m = 7) gives 256
    (Micikevicius et al. 2017, section 3.1). The sum is formed exactly in float64 and rounded
    once to `fmt`.

    Parameters
    ----------
    fmt : Format
        The format the addition is rounded to.
    x : float, optional
        The weight, a normal number of `fmt`. Default 1.0.

    Returns
    -------
    ratio : int
        The ratio `x / y`, a power of two.

    Examples
    --------
    >>> swamping_ratio(FLOAT16), swamping_ratio(BFLOAT16)
    (2048, 256)
    """
    xq = float(quantize(np.float64(x), fmt))
    for k in range(1, 60):
        total = np.float64(xq) + np.float64(xq) * 2.0**-k  # exact in float64 for k < 53
        if float(quantize(total, fmt)) == xq:
            return 2**k
    raise ValueError(f"no swamping found for {fmt} at x = {x!r}")


def _problem(rng: np.random.Generator, d: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A well-conditioned least-squares problem: A^T A has eigenvalues in [0.5, 1]."""
    n = 4 * d
    u, _ = np.linalg.qr(rng.standard_normal((n, d)))  # N,D orthonormal columns
    v, _ = np.linalg.qr(rng.standard_normal((d, d)))  # D,D
    sing = np.sqrt(np.linspace(0.5, 1.0, d))
    a = ((u * sing) @ v.T).astype(np.float32)  # N,D
    w_star = (rng.uniform(0.5, 2.0, d) * rng.choice([-1.0, 1.0], d)).astype(np.float32)  # D
    b = (a.astype(np.float64) @ w_star).astype(np.float32)  # N
    return a, b, w_star


def _descend(
    a: np.ndarray, b: np.ndarray, w_star: np.ndarray, mode: str, lr: float, steps: int,
    rng: np.random.Generator,
) -> dict[str, Any]:
    """Gradient descent with the weights stored as `mode` says; error curves in RMS."""
    d = a.shape[1]
    weights = Parameter(np.zeros(d, np.float32))  # D, the bf16 working weights (in float32)
    w = weights.data
    master = updater = None
    if mode == "master":  # fp32 masters, bf16 working copy refreshed after every step
        master = MasterWeights([weights], BFLOAT16)
    else:
        updater = LowPrecisionUpdater(BFLOAT16, mode, rng=rng)
    curve = np.empty(steps)  # T
    tail_start = int(steps * (1.0 - _TAIL))
    tail_sum = np.zeros(d)  # D, float64
    for t in range(steps):
        grad = a.T @ (a @ w - b)  # D, the gradient at the working weights
        delta = (-lr * grad).astype(np.float32)  # D
        if master is not None:
            master.masters[0].data += delta
            master.refresh()
        else:
            assert updater is not None
            updater.apply(w, delta)
        curve[t] = np.sqrt(np.mean((w.astype(np.float64) - w_star) ** 2))
        if t >= tail_start:
            tail_sum += w
    tail_mean = tail_sum / (steps - tail_start)
    return {
        "curve": curve,
        "final": float(curve[-1]),
        "tail_mean": float(np.sqrt(np.mean((tail_mean - w_star) ** 2))),
    }


def _plot(curves: dict[str, np.ndarray], lr: float, table: dict[str, list[float]],
          floor: float) -> Any:
    fig, (ax0, ax1) = new_figure(1, 2)
    for mode in MODES:
        ax0.plot(np.arange(1, curves[mode].size + 1), curves[mode] / floor, label=_LABELS[mode],
                 **_STYLE[mode], markevery=0.1)
    ax0.axhline(1.0, color="k", ls=":", label="bf16 storage floor")
    ax0.set(xscale="log", yscale="log", xlabel="step", ylabel="RMS error of w / storage floor",
            title=f"Least squares, step size {lr:g}")
    ax0.legend(fontsize=8)
    for mode in MODES:
        ax1.plot(_LRS, np.array(table[mode]) / floor, label=_LABELS[mode], **_STYLE[mode])
    ax1.axhline(1.0, color="k", ls=":", label="bf16 storage floor")
    ax1.set(xscale="log", yscale="log", xlabel="step size (learning rate)",
            ylabel="error of the stored weights / storage floor",
            title="Error left when the updates stop")
    ax1.legend(fontsize=8)
    return fig


def measure(settings: Settings, progress: Progress) -> dict[str, Any]:
    """Descend with every storage mode at every step size; the swamping thresholds."""
    d = settings.pick(32, 64, 256)
    rng = np.random.default_rng(settings.seed)
    a, b, w_star = _problem(rng, d)
    floor = float(np.sqrt(np.mean((quantize(w_star, BFLOAT16).astype(np.float64) - w_star) ** 2)))
    progress.start(len(_LRS) * len(MODES), "update stall")
    errors: dict[str, list[float]] = {m: [] for m in MODES}  # tail-averaged, per lr
    finals: dict[str, list[float]] = {m: [] for m in MODES}  # last step, per lr
    curves: dict[str, np.ndarray] = {}
    for lr in _LRS:
        steps = int(np.ceil(settings.pick(14.0, 18.0, 24.0) / (0.5 * lr)))  # to ~1e-6 in fp32
        for mode in MODES:
            sub = np.random.default_rng(rng.integers(2**63))
            out = _descend(a, b, w_star, mode, lr, steps, sub)
            errors[mode].append(out["tail_mean"])
            finals[mode].append(out["final"])
            if lr == _LRS[-1]:
                curves[mode] = out["curve"]
            progress.advance()
    swamp = {"fp16": swamping_ratio(FLOAT16), "bf16": swamping_ratio(BFLOAT16)}
    return {"d": d, "floor": floor, "errors": errors, "finals": finals, "curves": curves,
            "swamp": swamp}


def checks(m: dict[str, Any]) -> list[Check]:
    """Each criterion reads only the measured numbers `m`.

    See [measure][normlab.lab.experiments.update_stall.measure].
    """
    floor, errors, finals, swamp = m["floor"], m["errors"], m["finals"], m["swamp"]
    near = np.array(errors["nearest"])
    growth = near[1:] / near[:-1]
    worst = {mode: max(finals[mode]) / floor for mode in MODES}  # the stored weights
    found = [
        Check(
            source="Micikevicius et al. 2017, section 3.1",
            claim="With low-precision weights, updates below half an ulp are lost, so the "
            "smaller the step the earlier (farther from the optimum) training stalls.",
            criterion=f"round-to-nearest error grows >= {_GROWTH_MIN}x per 5x smaller step",
            measured="growth " + ", ".join(f"{g:.1f}x" for g in growth),
            passed=bool(np.all(growth >= _GROWTH_MIN)),
            values={"growth": growth.tolist()},
        ),
        Check(
            source="Zamirai et al. 2020",
            claim="Pure bf16 weights with round-to-nearest updates stay far from the "
            "solution that bf16 could represent.",
            criterion=f"round-to-nearest error >= {_ABOVE_FLOOR_MIN}x the bf16 storage floor "
            "at every step size",
            measured=f"{near.min() / floor:.1f}x to {near.max() / floor:.1f}x the floor",
            passed=bool(near.min() >= _ABOVE_FLOOR_MIN * floor),
            values={"ratio_to_floor": (near / floor).tolist()},
        ),
    ]
    for mode in ("master", "kahan", "stochastic"):
        found.append(
            Check(
                source="Micikevicius et al. 2017, section 3.1" if mode == "master"
                else "Zamirai et al. 2020",
                claim=f"With {_LABELS[mode]} the weights reach the accuracy bf16 can store.",
                criterion=f"error of the stored weights after the last step <= {_WITHIN_FLOOR}x "
                "the bf16 storage floor at every step size (2x: a bf16 neighbour of w*, "
                "either one)",
                measured=f"last step: worst {worst[mode]:.2f}x the floor (tail average "
                f"{max(errors[mode]) / floor:.2f}x)",
                passed=bool(worst[mode] <= _WITHIN_FLOOR),
                values={"ratio_to_floor": [e / floor for e in finals[mode]],
                        "tail_ratio_to_floor": [e / floor for e in errors[mode]]},
            )
        )
    found.append(
        Check(
            source="Micikevicius et al. 2017, section 3.1",
            claim="An update is lost when the weight is 2048x larger (fp16); bf16's 7 "
            "mantissa bits lose it at 256x.",
            criterion="smallest power-of-two ratio x/y with fl(x + y) == x at x = 1: "
            "fp16 2048, bf16 256",
            measured=f"fp16 {swamp['fp16']}x, bf16 {swamp['bf16']}x",
            passed=swamp == {"fp16": 2048, "bf16": 256},
            values=dict(swamp),
        )
    )
    return found


def tables(m: dict[str, Any]) -> list[str]:
    """Error of each storage mode at each step size, last step and tail average."""
    floor, errors, finals = m["floor"], m["errors"], m["finals"]
    header = ["weights", *(f"lr {lr:g}: last step (tail)" for lr in _LRS)]
    rows = [[_LABELS[mode], *(f"{f / floor:.2f}x ({e / floor:.2f}x)"
                               for e, f in zip(errors[mode], finals[mode], strict=True))]
            for mode in MODES]
    return [markdown_table(header, rows)]


def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Run the least-squares comparison and measure the swamping thresholds."""
    with single_threaded():  # tiny arrays: threads would only wait on each other
        m = measure(settings, progress)
    d, floor = m["d"], m["floor"]
    summary = (
        f"Gradient descent on a {4 * d}x{d} least-squares problem with the weights kept in "
        "bf16 four ways. Errors are RMS distances to the exact solution of the weights stored "
        f"after the last step (in parentheses: of the weights averaged over the last "
        f"{int(_TAIL * 100)}% of the steps; dithering methods sit between the two bf16 "
        f"neighbours of w*), in units of the bf16 storage floor {floor:.3g} (RMS error of w* "
        "rounded to bf16)."
    )
    return ExperimentResult(
        name=NAME, title=TITLE, seed=settings.seed, summary=summary, checks=checks(m),
        figures={"errors": _plot(m["curves"], _LRS[-1], m["finals"], floor)},
        tables=tables(m),
        metrics={
            "storage_floor": floor,
            "learning_rates": list(_LRS),
            "tail_error": m["errors"],
            "final_error": m["finals"],
            "swamping_ratio": m["swamp"],
        },
        settings={"d": d, "n": 4 * d, "learning_rates": list(_LRS), "tail_fraction": _TAIL},
    )
