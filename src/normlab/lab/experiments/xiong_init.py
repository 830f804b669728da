"""Experiment 1: Post-LN vs Pre-LN at initialization (Xiong et al. 2020, Lemma 2, Theorem 1).

The paper's simplified Transformer: W^Q = W^K = 0 (uniform attention), Xavier-normal
weights N(0, 2/(fan_in + fan_out)) = N(0, 1/d) for the d x d matrices, biases zero, ReLU FFN
of width d, LayerNorm without affine change at init (gain 1, bias 0). Built from
[normlab.nn.TransformerBlock][]
(`zero_qk=True, init="xavier_normal", activation="relu", bias=False`); attention is causal
here (the paper's encoder attends to all positions), which leaves both statements
unchanged: the attention term they bound lies between 0 and d whatever positions are
averaged. Inputs are i.i.d. Gaussian token vectors
rescaled to ||x||^2 = d, as after an embedding LayerNorm.

Lemma 2 (expectation over the weights): Post-LN, E||x^{post,5}_l||^2 = 3d/2 at every layer
l (x^{post,5} = h + FFN(h), the sum before the layer's last LayerNorm); Pre-LN,
(1 + l/2) d <= E||x_l||^2 <= (1 + 3l/2) d, x_l the residual stream after l layers. The
mean over seeds and tokens of ||.||^2/d must lie in 1.5 +- 0.1 (Post-LN) and in the bounds.

Theorem 1: the gradient of the last layer's FFN weight W^{2,L} is O(d sqrt(ln d)) for
Post-LN, independent of L, and O(d sqrt(ln d / L)) for Pre-LN. The loss is a softmax
cross-entropy read out by a random linear head; the bound is proved token by token, so the
measured quantity is the per-token gradient ||dLoss_t/dW^{2,L}||_F = ||r_t|| ||g_t|| (r_t
the ReLU features entering W^2, g_t the gradient at its output, taken from the library's
backward), root-mean-squared over tokens, for L in {6, 12, 24, 48}. Its log-log slope must be
within +-0.15 (Post-LN) and in [-0.8, -0.35] (Pre-LN, ideal -1/2). The gradient of the mean
loss is reported too: as depth grows the tokens become alike (every FFN output shares the
component E[ReLU] 1^T W^2), their gradients add coherently and its Post-LN slope drifts
up (about +0.05 to +0.17 here). A depth-L model is the first L blocks of one 48-block stack
(blocks are i.i.d.), so one forward per seed serves every depth.

Shapes: B sequences, T positions, C = d model width, V classes of the readout.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.lab.experiments._xiong_figures import xiong_figures
from normlab.lab.result import Check, ExperimentResult, Progress, Settings
from normlab.lab.tables import markdown_table
from normlab.lab.training import on_references
from normlab.nn import LayerNorm, Linear, TransformerBlock, softmax_cross_entropy

__all__ = ["DEPTHS", "DETECTS", "NAME", "TITLE", "last_ffn_grad_norms", "lemma2_profile", "run"]

DETECTS = ("Pre-LN and Post-LN placements swapped in the residual block",)
NAME = "xiong_init"
TITLE = "Post-LN vs Pre-LN at initialization (Xiong et al. 2020, Lemma 2 and Theorem 1)"
DEPTHS = (6, 12, 24, 48)
"""The depths L of Theorem 1's gradient measurement."""
POST_TARGET = 1.5
r"""Lemma 2: Post-LN's expected $\|x^{post,5}_l\|^2 / d$ at every layer, 3/2."""
POST_TOL = 0.1
"""Lemma 2: the tolerance around `POST_TARGET` of the measured mean."""
PRE_SLOPE = (-0.8, -0.35)
"""Theorem 1: the band of log-log slopes of Pre-LN's last-layer gradient against L
(ideal -1/2)."""
POST_SLOPE_TOL = 0.15
"""Theorem 1: the largest absolute log-log slope of Post-LN's last-layer
gradient against L (independent of L)."""
_T, _V = 16, 16  # positions per sequence, readout classes


def _blocks(placement: str, d: int, n: int, rng: np.random.Generator) -> list[Any]:
    return [
        TransformerBlock(
            d, 1, d, placement, "layer", rng=rng, activation="relu", bias=False,
            init="xavier_normal", zero_qk=True,
        )
        for _ in range(n)
    ]  # fmt: skip


def _inputs(d: int, batch: int, rng: np.random.Generator) -> np.ndarray:
    x = rng.standard_normal((batch, _T, d)).astype(np.float32)  # B,T,C
    x -= x.mean(axis=-1, keepdims=True)
    return x * np.sqrt(d / np.sum(x * x, axis=-1, keepdims=True))  # ||x||^2 = d per token


def _forward(placement: str, blocks: list[Any], x: np.ndarray) -> tuple[list[float], list, list]:
    """Run the stack block by block.

    Returns (||probe_l||^2/d for l = 1..L, block outputs, FFN inputs), all (B,T,C) arrays.
    """
    d = x.shape[-1]
    probes, outs, ffn_ins = [], [], []
    for blk in blocks:
        h = blk.attn_residual.forward(x)  # B,T,C: N1(x + Attn(x)) or x + Attn(N1(x))
        if placement == "post":
            x5 = h + blk.ffn.forward(h)  # x^{post,5}: before the layer's last LayerNorm
            x = blk.mlp_residual.norm.forward(x5)
            probes.append(float(np.mean(np.sum(x5.astype(np.float64) ** 2, axis=-1)) / d))
            ffn_ins.append(h)
        else:
            n = blk.mlp_residual.norm.forward(h)
            x = h + blk.ffn.forward(n)
            probes.append(float(np.mean(np.sum(x.astype(np.float64) ** 2, axis=-1)) / d))
            ffn_ins.append(n)
        outs.append(x)
    return probes, outs, ffn_ins


def lemma2_profile(placement: str, d: int, layers: int, seed: int, batch: int = 8) -> np.ndarray:
    """||x_l||^2 / d (Pre-LN) or ||x^{post,5}_l||^2 / d (Post-LN) for l = 1..layers, one seed."""
    rng = np.random.default_rng(seed)
    blocks = _blocks(placement, d, layers, rng)
    probes, _, _ = _forward(placement, blocks, _inputs(d, batch, rng))
    return np.array(probes)


def last_ffn_grad_norms(
    placement: str, d: int, depths: tuple[int, ...], seed: int, batch: int = 8
) -> dict[str, np.ndarray]:
    """Gradients of the last FFN weight W^{2,L} for each depth L in `depths`, one seed.

    Returns arrays over depths: `per_token` = root mean square over tokens t of
    ||dLoss_t/dW^{2,L}||_F = ||r_t|| ||g_t|| (r_t the ReLU features entering W^2, g_t the
    gradient reaching its output; the quantity Theorem 1 bounds token by token),
    `full` = ||dLoss/dW^{2,L}||_F of the mean loss from `normlab.nn`'s backward,
    `mismatch` = relative difference between that backward and sum_t r_t g_t^T / N,
    and `probes`, the Lemma 2 profile of the same forward.
    """
    rng = np.random.default_rng(seed)
    blocks = _blocks(placement, d, max(depths), rng)
    x = _inputs(d, batch, rng)
    head = Linear(d, _V, bias=False, rng=rng, init="xavier_normal")
    final = LayerNorm(d)
    targets = rng.integers(0, _V, size=(batch, _T))  # B,T
    probes, outs, ffn_ins = _forward(placement, blocks, x)
    n_tok = batch * _T
    per_token, full, mismatch = [], [], []
    for depth in depths:
        blk = blocks[depth - 1]
        top = final.forward(outs[depth - 1]) if placement == "pre" else outs[depth - 1]
        _, dlogits = softmax_cross_entropy(head.forward(top), targets)  # B,T,V
        dtop = head.backward(dlogits)  # B,T,C
        if placement == "pre":  # y = h + FFN(N2(h)): the FFN output gets dy itself
            dffn = final.backward(dtop)
        else:  # y = N2(x5), x5 = h + FFN(h)
            dffn = blk.mlp_residual.norm.backward(dtop)
        w1, w2 = blk.ffn.fc1.weight, blk.ffn.fc2.weight
        w2.grad = None
        blk.ffn.backward(dffn)
        g = dffn.reshape(n_tok, d).astype(np.float64)  # N,C (of the mean loss)
        r = np.maximum(ffn_ins[depth - 1].reshape(n_tok, d) @ w1.data.T, 0.0)  # N,F
        r = r.astype(np.float64)
        tok = np.linalg.norm(r, axis=1) * np.linalg.norm(g, axis=1) * n_tok  # N
        per_token.append(float(np.sqrt(np.mean(tok**2))))
        full.append(float(np.linalg.norm(w2.grad)))
        direct = g.T @ r  # C,F: sum over tokens, as the library's accumulated gradient
        mismatch.append(float(np.linalg.norm(direct - w2.grad) / np.linalg.norm(direct)))
    return {
        "per_token": np.array(per_token),
        "full": np.array(full),
        "mismatch": np.array(mismatch),
        "probes": np.array(probes),
    }


def _slope(depths: tuple[int, ...], values: np.ndarray) -> float:
    return float(np.polyfit(np.log(depths), np.log(values), 1)[0])


def measure(settings: Settings, progress: Progress) -> dict[str, Any]:
    """Lemma 2's norms and Theorem 1's gradient norms over depth, over seeds."""
    d_lemma, layers = 512, 12
    n_lemma = settings.pick(5, 8, 16)
    d_thm = settings.pick(128, 256, 512)
    n_thm = settings.pick(5, 6, 10)
    batch = settings.pick(4, 8, 16)  # sequences of _T positions per seed
    progress.start(2 * (n_lemma + n_thm), "Xiong et al.: Post-LN vs Pre-LN")
    seeds = np.random.SeedSequence(settings.seed).generate_state(n_lemma + n_thm)
    lemma: dict[str, np.ndarray] = {}
    grads: dict[str, np.ndarray] = {}
    full: dict[str, np.ndarray] = {}
    mismatch = 0.0
    for placement in ("post", "pre"):
        rows = []
        for s in seeds[:n_lemma]:
            rows.append(lemma2_profile(placement, d_lemma, layers, int(s), batch))
            progress.advance()
        lemma[placement] = np.array(rows)  # seeds, layers
        per_token, whole = [], []
        for s in seeds[n_lemma:]:
            out = last_ffn_grad_norms(placement, d_thm, DEPTHS, int(s), batch)
            per_token.append(out["per_token"])
            whole.append(out["full"])
            mismatch = max(mismatch, float(np.max(out["mismatch"])))
            progress.advance()
        grads[placement] = np.array(per_token)  # seeds, depths
        full[placement] = np.array(whole)  # seeds, depths
    return {
        "d_lemma": d_lemma, "layers": layers, "n_lemma": n_lemma, "d_thm": d_thm,
        "n_thm": n_thm, "batch": batch, "lemma": lemma, "grads": grads, "full": full,
        "mismatch": mismatch, "post": lemma["post"].mean(axis=0),
        "pre": lemma["pre"].mean(axis=0),
        "slope_post": _slope(DEPTHS, grads["post"].mean(axis=0)),
        "slope_pre": _slope(DEPTHS, grads["pre"].mean(axis=0)),
    }


def checks(m: dict[str, Any]) -> list[Check]:
    """Each criterion reads only the measured numbers `m`.

    See [measure][normlab.lab.experiments.xiong_init.measure].
    """
    post, pre, layers, d_lemma = m["post"], m["pre"], m["layers"], m["d_lemma"]
    n_lemma, batch, n_thm, d_thm = m["n_lemma"], m["batch"], m["n_thm"], m["d_thm"]
    slope_post, slope_pre, grads = m["slope_post"], m["slope_pre"], m["grads"]
    ls = np.arange(1, layers + 1)
    post_dev = float(np.max(np.abs(post - POST_TARGET)))
    pre_ok = bool(np.all((pre >= 1 + ls / 2) & (pre <= 1 + 3 * ls / 2)))
    src2, src_t = "Xiong et al. 2020, Lemma 2", "Xiong et al. 2020, Theorem 1"
    return [
        Check(
            src2,
            "Post-LN: E||x^{post,5}_l||² = 3d/2 at every layer",
            f"mean over {n_lemma} seeds x {batch * _T} tokens of ||x^{{post,5}}_l||²/d within "
            f"{POST_TARGET} +- {POST_TOL} for l = 1..{layers} (d = {d_lemma})",
            f"{post.min():.3f} .. {post.max():.3f} (max deviation {post_dev:.3f})",
            post_dev <= POST_TOL,
            {"per_layer": post.tolist()},
        ),
        Check(
            src2,
            "Pre-LN: (1 + l/2) d <= E||x_l||² <= (1 + 3l/2) d (grows linearly with depth)",
            f"mean ||x_l||²/d in [1 + l/2, 1 + 3l/2] for l = 1..{layers} (d = {d_lemma})",
            f"l = 1: {pre[0]:.2f} in [1.5, 2.5]; l = {layers}: {pre[-1]:.2f} in "
            f"[{1 + layers / 2:g}, {1 + 3 * layers / 2:g}]",
            pre_ok,
            {"per_layer": pre.tolist()},
        ),
        Check(
            src_t,
            "Post-LN: the last FFN weight's gradient does not shrink with depth L",
            f"log-log slope of the per-token ||dLoss_t/dW^{{2,L}}||_F (RMS over tokens, "
            f"mean over {n_thm} seeds) vs L in {list(DEPTHS)} within +-{POST_SLOPE_TOL} "
            f"(d = {d_thm})",
            f"slope {slope_post:+.3f}",
            abs(slope_post) <= POST_SLOPE_TOL,
            {"slope": slope_post, "grad_norms": grads["post"].mean(axis=0).tolist()},
        ),
        Check(
            src_t,
            "Pre-LN: the last FFN weight's gradient falls like L^(-1/2)",
            f"log-log slope in [{PRE_SLOPE[0]}, {PRE_SLOPE[1]}]",
            f"slope {slope_pre:+.3f}",
            PRE_SLOPE[0] <= slope_pre <= PRE_SLOPE[1],
            {"slope": slope_pre, "grad_norms": grads["pre"].mean(axis=0).tolist()},
        ),
    ]


def tables(m: dict[str, Any]) -> list[str]:
    """Lemma 2 per layer; Theorem 1 per depth with the slopes."""
    post, pre, grads, full = m["post"], m["pre"], m["grads"], m["full"]
    table = markdown_table(
        ["l", "Post-LN ||x^{post,5}_l||²/d", "Pre-LN ||x_l||²/d", "Pre-LN bounds"],
        [[i + 1, f"{post[i]:.3f}", f"{pre[i]:.2f}", f"[{1 + (i + 1) / 2:g}, {1 + 1.5 * (i + 1):g}]"]
         for i in range(m["layers"])],
    )
    cells = [grads["post"], grads["pre"], full["post"], full["pre"]]
    slopes_full = {k: _slope(DEPTHS, v.mean(axis=0)) for k, v in full.items()}
    gt = markdown_table(
        ["L", "Post-LN per token", "Pre-LN per token", "Post-LN mean loss", "Pre-LN mean loss"],
        [[depth, *(f"{c[:, j].mean():.4g}" for c in cells)] for j, depth in enumerate(DEPTHS)]
        + [["slope", f"{m['slope_post']:+.3f}", f"{m['slope_pre']:+.3f}",
            f"{slopes_full['post']:+.3f}", f"{slopes_full['pre']:+.3f}"]],
    )
    return [table, gt]


def _run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Measure Lemma 2's norms and Theorem 1's gradient-vs-depth slopes, then judge."""
    m = measure(settings, progress)
    grads, full = m["grads"], m["full"]
    slopes_full = {k: _slope(DEPTHS, v.mean(axis=0)) for k, v in full.items()}
    return ExperimentResult(
        name=NAME,
        title=TITLE,
        seed=settings.seed,
        summary=(
            "The simplified Transformer of Xiong et al. (W^Q = W^K = 0, Xavier init, ReLU FFN "
            "of width d) built from `normlab.nn.TransformerBlock` at initialization. Post-LN "
            "keeps every layer's pre-norm sum at 1.5 d and hands the last layer a gradient "
            "that ignores depth; Pre-LN's residual stream grows linearly, so the final "
            "LayerNorm divides the last layer's gradient by about sqrt(L). Theorem 1 bounds "
            "the gradient token by token, so the checks use the per-token gradient norm "
            "||r_t|| ||g_t||; the table also shows the norm of the mean-loss gradient from "
            "the library's backward, whose Post-LN slope drifts upward because tokens grow "
            "alike with depth (their gradients add coherently)."
        ),
        checks=checks(m),
        figures=xiong_figures(m["d_lemma"], m["lemma"], m["d_thm"], grads, DEPTHS,
                              (POST_TARGET, POST_TOL)),
        tables=tables(m),
        metrics={
            "lemma2_post_per_layer": m["post"].tolist(),
            "lemma2_pre_per_layer": m["pre"].tolist(),
            "theorem1_depths": list(DEPTHS),
            "theorem1_post_grad_norms": grads["post"].mean(axis=0).tolist(),
            "theorem1_pre_grad_norms": grads["pre"].mean(axis=0).tolist(),
            "theorem1_post_slope": m["slope_post"],
            "theorem1_pre_slope": m["slope_pre"],
            "theorem1_mean_loss_grad_norms": {k: v.mean(axis=0).tolist() for k, v in full.items()},
            "theorem1_mean_loss_slopes": slopes_full,
            "backward_vs_direct_max_rel_mismatch": m["mismatch"],
        },
        settings={
            "lemma2_d": m["d_lemma"],
            "lemma2_layers": m["layers"],
            "lemma2_seeds": m["n_lemma"],
            "theorem1_d": m["d_thm"],
            "theorem1_depths": list(DEPTHS),
            "theorem1_seeds": m["n_thm"],
            "tokens_per_seed": m["batch"] * _T,
            "readout_classes": _V,
        },
    )


@on_references
def run(settings: Settings, progress: Progress) -> ExperimentResult:
    """Run the experiment (see the module docstring) on the NumPy references, one thread."""
    return _run(settings, progress)
