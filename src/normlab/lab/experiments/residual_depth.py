"""Residual placements vs depth: the model update of one step and the output change under a
parameter perturbation (Wang et al. 2022 "DeepNet"; Liu et al. 2020 "Admin").

Model (:mod:`._residual_models`): tiny decoder stacks of N layers, width 64, MLP width 128,
2 heads (the "64-128-2" size of DeepNet's model-update figure), causal attention, ReLU,
Xavier-normal weights, float64, for N in DEPTHS (6, 12, 24, 48; ``--full`` adds 96 and
averages 3 seeds; the quick smoke size uses 2..16 and only the judged placements), one
fresh stack per (placement, N, seed) for the update; the perturbation reads every N off
one stack of the largest N (the first N layers of a deeper stack are an N-layer stack),
except DeepNorm whose constants depend on N.
Inputs: B x T Gaussian token vectors; a fixed random readout (Xavier, V = 16 classes) and
random targets give a softmax cross-entropy loss. F(x) is the stack's output (after the
final LayerNorm where the placement has one). Placements: post, deepnorm, admin, pre,
sandwich, rezero.

1. Model update (DeepNet, Section 4: with DeepNorm's alpha and beta the model update
   ||Delta F|| = ||F(x, theta_1) - F(x, theta_0)|| stays bounded, O(eta), independent of
   depth, where Post-LN's grows with N; their figure of model updates at early training
   shows 64-128-2 Transformers from 6L-6L to 100L-100L). One AdamW step (lr = LR,
   betas (0.9, 0.98), no weight decay: Adam's first step moves every weight by about
   +-lr) from initialisation; measured: the root mean square over tokens of
   ||F_t(theta_1) - F_t(theta_0)||_2, averaged over seeds.
2. Output change under a perturbation (Admin, Theorem 2 and Section 4: at initialisation
   Var[F(x, W) - F(x, W*)] grows like O(N) for Post-LN and like O(log N) for Pre-LN;
   Admin's omega initialisation brings Post-LN down to O(log N)). Every Linear weight
   W gets W* = W + SIGMA * std(W) * xi with xi ~ N(0, 1) (norms untouched); measured: the
   mean over tokens of ||F_t(W*) - F_t(W)||^2 / C, averaged over PERTURB_DRAWS draws and
   over seeds. ReZero is the identity at init (alpha = 0): its change is exactly 0 and it
   is listed, not fitted.

Criteria (fixed before the first run; a slope is the least-squares slope of the log of
the measured value against log N over the depths):

* U1 Post-LN update grows with depth: slope >= POST_UPDATE_MIN_SLOPE (+0.3: at least
  about 1.9x from N = 6 to N = 48).
* U2 DeepNorm update is bounded: slope <= DEEPNORM_UPDATE_MAX_SLOPE (+0.15), and its
  update at the largest N is below Post-LN's there.
* P1 Post-LN output change is O(N): slope within POST_CHANGE_SLOPE ([0.75, 1.25]).
* P2 Pre-LN output change is O(log N): slope <= LOG_CHANGE_MAX_SLOPE (+0.6; ln N itself
  has a local log-log slope 1/ln N, 0.56 at N = 6 and 0.26 at N = 48).
* P3 Admin output change is O(log N): the same bound as P2.

DeepNorm, sandwich (peri-LN) and ReZero are shown in both panels beside them; only the
claims above are judged. A result outside a criterion is reported as not reproduced at
this scale, with its numbers.
"""

from __future__ import annotations

import numpy as np

from normlab.lab.experiments._notes import not_reproduced
from normlab.lab.experiments._residual_figures import residual_figures
from normlab.lab.experiments._residual_models import PLACEMENTS, build_stack, stack_output
from normlab.lab.result import Check, ExperimentResult, Progress, Settings
from normlab.lab.training import on_references
from normlab.nn import Linear, PreNormStack, softmax_cross_entropy
from normlab.nn.optim import AdamW

__all__ = ["DEPTHS", "DETECTS", "NAME", "TITLE", "output_change", "run", "update_size"]

NAME = "residual_depth"
TITLE = "Residual placements vs depth: model update (DeepNet) and output change (Admin)"
DETECTS: tuple[str, ...] = ("pre_post_swapped",)
DEPTHS = (6, 12, 24, 48)
QUICK_DEPTHS = (2, 4, 8, 16)  # smoke size for tests: the judged placements only
JUDGED = ("post", "deepnorm", "admin", "pre")
FULL_DEPTHS = (6, 12, 24, 48, 96)
D, D_FF, HEADS, T, V = 64, 128, 2, 16, 16
LR = 1e-3
SIGMA = 1e-3
PERTURB_DRAWS = 2
POST_UPDATE_MIN_SLOPE = 0.3
DEEPNORM_UPDATE_MAX_SLOPE = 0.15
POST_CHANGE_SLOPE = (0.75, 1.25)
LOG_CHANGE_MAX_SLOPE = 0.6


def _setup(
    placement: str, depth: int, seed: int, batch: int
) -> tuple[np.random.Generator, np.ndarray, PreNormStack]:
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((batch, T, D))  # B,T,C
    stack = build_stack(placement, depth, x, rng, d_ff=D_FF, n_heads=HEADS)
    return rng, x, stack


def update_size(placement: str, depth: int, seed: int, batch: int = 4) -> float:
    """RMS over tokens of ||F_t(theta_1) - F_t(theta_0)|| after one AdamW step (lr LR)."""
    rng, x, stack = _setup(placement, depth, seed, batch)
    head = Linear(D, V, bias=False, rng=rng, init="xavier_normal", dtype=np.float64)
    targets = rng.integers(0, V, size=x.shape[:2])  # B,T
    y0 = stack.forward(x)  # B,T,C
    _, dlogits = softmax_cross_entropy(head.forward(y0), targets)
    stack.backward(head.backward(dlogits))
    AdamW(stack.parameters(), lr=LR, betas=(0.9, 0.98), weight_decay=0.0).step()
    y1 = stack_output(stack, x)
    return float(np.sqrt(np.mean(np.sum((y1 - y0) ** 2, axis=-1))))


def _outputs_by_depth(stack: PreNormStack, x: np.ndarray, depths: tuple[int, ...]) -> list:
    """F(x) of the first N layers of ``stack`` for each N in ``depths`` (one pass).

    Valid where no parameter depends on the total depth (every placement but deepnorm):
    the first N layers of a deeper stack are an N-layer stack (Admin's omega_i only
    depends on the layers below i; the final norm has gain 1 and bias 0 at init).
    """
    outs, h = [], x
    final = stack.final_norm
    for i, res in enumerate(stack.blocks):
        h = res.forward(h)  # B,T,C
        if (i + 1) % 2 == 0 and (i + 1) // 2 in depths:
            outs.append(h if final is None else final.forward(h))
    stack.clear_cache()
    return outs


def output_change(
    placement: str, depths: tuple[int, ...], seed: int, batch: int = 4
) -> np.ndarray:
    """Mean over tokens and PERTURB_DRAWS draws of ||F_t(W*) - F_t(W)||^2 / C, per depth."""
    if placement == "deepnorm":  # alpha and beta depend on N: one stack per depth
        return np.array([output_change_of(*_setup(placement, n, seed, batch), (n,))[0]
                         for n in depths])  # fmt: skip
    return output_change_of(*_setup(placement, max(depths), seed, batch), depths)


def output_change_of(
    rng: np.random.Generator, x: np.ndarray, stack: PreNormStack, depths: tuple[int, ...]
) -> np.ndarray:
    """The perturbation measurement of :func:`output_change` on one built stack."""
    y = _outputs_by_depth(stack, x, depths)
    weights = [p for name, p in stack.named_parameters() if name.endswith("weight")
               and p.data.ndim == 2]  # fmt: skip
    clean = [p.data for p in weights]
    changes = np.zeros((PERTURB_DRAWS, len(depths)))
    for k in range(PERTURB_DRAWS):
        for p, w in zip(weights, clean, strict=True):
            p.data = w + SIGMA * w.std() * rng.standard_normal(w.shape)
        for j, (y0, y1) in enumerate(zip(y, _outputs_by_depth(stack, x, depths), strict=True)):
            changes[k, j] = np.mean(np.sum((y1 - y0) ** 2, axis=-1)) / D
    for p, w in zip(weights, clean, strict=True):
        p.data = w
    return changes.mean(axis=0)


def _slope(depths: tuple[int, ...], values: np.ndarray) -> float:
    return float(np.polyfit(np.log(depths), np.log(values), 1)[0])


def _measure(settings: Settings, progress: Progress) -> tuple[tuple[int, ...], dict, dict, dict]:
    depths: tuple[int, ...] = settings.pick(QUICK_DEPTHS, DEPTHS, FULL_DEPTHS)
    n_seeds = settings.pick(1, 1, 3)
    batch = settings.pick(2, 4, 8)
    placements: tuple[str, ...] = settings.pick(JUDGED, PLACEMENTS, PLACEMENTS)
    progress.start((len(depths) + 1) * len(placements) * n_seeds, "Residual placements vs depth")
    seeds = [int(s) for s in np.random.SeedSequence(settings.seed).generate_state(n_seeds)]
    upd: dict[str, np.ndarray] = {}
    chg: dict[str, np.ndarray] = {}
    for placement in placements:
        u = np.zeros((n_seeds, len(depths)))
        c = np.zeros((n_seeds, len(depths)))
        for i, s in enumerate(seeds):
            for j, depth in enumerate(depths):
                u[i, j] = update_size(placement, depth, s, batch)
                progress.advance()
            if placement != "rezero":  # the identity at init: its change is exactly 0
                c[i] = output_change(placement, depths, s, batch)
            progress.advance()
        upd[placement], chg[placement] = u.mean(axis=0), c.mean(axis=0)
    used = {"d": D, "d_ff": D_FF, "heads": HEADS, "tokens": batch * T, "seeds": n_seeds,
            "depths": list(depths), "lr": LR, "sigma": SIGMA, "draws": PERTURB_DRAWS}  # fmt: skip
    return depths, upd, chg, used


def _checks(depths: tuple[int, ...], upd: dict, chg: dict) -> list[Check]:
    su = {k: _slope(depths, upd[k]) for k in ("post", "deepnorm")}
    sc = {k: _slope(depths, chg[k]) for k in ("post", "pre", "admin")}
    big = depths[-1]
    src_u = "Wang et al. 2022 (DeepNet), Section 4, model update ||ΔF||"
    src_c = "Liu et al. 2020 (Admin), Theorem 2 and Section 4"
    ns = f"N in {list(depths)}"
    deep_below = bool(upd["deepnorm"][-1] < upd["post"][-1])
    lo, hi = POST_CHANGE_SLOPE
    return [
        Check(src_u, "Post-LN: the model update of one step grows with depth",
              f"log-log slope of ||ΔF|| vs {ns} >= {POST_UPDATE_MIN_SLOPE}",
              f"slope {su['post']:+.3f}", su["post"] >= POST_UPDATE_MIN_SLOPE,
              {"slope": su["post"], "update": upd["post"].tolist()}, if_false="NOT REPRODUCED"),
        Check(src_u, "DeepNorm: the model update stays bounded (O(eta)) as depth grows",
              f"slope <= {DEEPNORM_UPDATE_MAX_SLOPE} and ||ΔF|| at N = {big} below Post-LN's",
              f"slope {su['deepnorm']:+.3f}; N = {big}: {upd['deepnorm'][-1]:.3g} vs Post-LN "
              f"{upd['post'][-1]:.3g}",
              su["deepnorm"] <= DEEPNORM_UPDATE_MAX_SLOPE and deep_below,
              {"slope": su["deepnorm"], "update": upd["deepnorm"].tolist()},
              if_false="NOT REPRODUCED"),
        Check(src_c, "Post-LN: output change under a parameter perturbation is O(N)",
              f"log-log slope of E||ΔF||²/C vs {ns} in [{lo}, {hi}]",
              f"slope {sc['post']:+.3f}", lo <= sc["post"] <= hi,
              {"slope": sc["post"], "change": chg["post"].tolist()}, if_false="NOT REPRODUCED"),
        Check(src_c, "Pre-LN: output change is O(log N)",
              f"slope <= {LOG_CHANGE_MAX_SLOPE} (ln N: local slope 0.26-0.56 for N = 6..48)",
              f"slope {sc['pre']:+.3f}", sc["pre"] <= LOG_CHANGE_MAX_SLOPE,
              {"slope": sc["pre"], "change": chg["pre"].tolist()}),
        Check(src_c, "Admin (omega from output-variance profiling): output change is O(log N)",
              f"slope <= {LOG_CHANGE_MAX_SLOPE}",
              f"slope {sc['admin']:+.3f}", sc["admin"] <= LOG_CHANGE_MAX_SLOPE,
              {"slope": sc["admin"], "change": chg["admin"].tolist()}, if_false="NOT REPRODUCED"),
    ]  # fmt: skip


def _table(depths: tuple[int, ...], upd: dict, chg: dict) -> str:
    head = "| placement | " + " | ".join(f"ΔF, N={n}" for n in depths) + " | slope | "
    head += " | ".join(f"change, N={n}" for n in depths) + " | slope |"
    rows = [head, "|---" * (2 * len(depths) + 3) + "|"]
    for k in upd:
        su = f"{_slope(depths, upd[k]):+.2f}"
        sc = "0 exactly" if k == "rezero" else f"{_slope(depths, chg[k]):+.2f}"
        cells = [f"{v:.3g}" for v in upd[k]] + [su] + [f"{v:.3g}" for v in chg[k]] + [sc]
        rows.append(f"| {k} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


@on_references
def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Run the experiment (see the module docstring) on the NumPy references, one thread."""
    depths, upd, chg, used = _measure(settings, progress)
    checks = _checks(depths, upd, chg)
    return ExperimentResult(
        name=NAME,
        title=TITLE,
        seed=settings.seed,
        summary=(
            "Tiny 64-128-2 decoder stacks with each residual placement of "
            "`normlab.nn.Residual`, at initialisation, for N = "
            f"{', '.join(map(str, depths))} layers: the size of the change of the output "
            f"after one AdamW step (lr {LR:g}) and under a random relative perturbation "
            f"{SIGMA:g} of every weight matrix. Criteria were fixed before the first run."
            + not_reproduced(checks)
        ),
        checks=checks,
        figures=residual_figures(depths, upd, chg),
        tables=[_table(depths, upd, chg)],
        metrics={"depths": list(depths), "update": {k: v.tolist() for k, v in upd.items()},
                 "output_change": {k: v.tolist() for k, v in chg.items()}},
        settings=used,
    )
