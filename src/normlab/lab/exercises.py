"""Runnable solutions to the chapter's Exercises 16.1-16.4, computed live with normlab.

`normlab exercise 16.N` prints [exercise_text][normlab.lab.exercises.exercise_text]; every
number in the text is computed when it is printed, from the library's functions, with a fixed
seed. Shapes: B examples (rows), D features.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from normlab import (
    batch_norm_forward,
    inverted_dropout,
    layer_norm_backward,
    layer_norm_forward,
    rms_norm_forward,
)
from normlab._backend import use_backend
from normlab.nn import Dropout, Linear, Residual, RMSNorm

__all__ = ["EXERCISES", "QUESTIONS", "exercise_question", "exercise_text"]

QUESTIONS: dict[str, tuple[str, str]] = {
    "16.1": (
        "★ Train vs inference statistics",
        "Explain why BatchNorm needs running statistics for inference, and why LayerNorm does "
        "not. Which axes are reduced by each method for an array of shape $B \\times d$?",
    ),
    "16.2": (
        "★★ LayerNorm backward",
        "Derive the LayerNorm input gradient in (16.3) from the centered input and row "
        "variance. Why do two row means appear in the formula?",
    ),
    "16.3": (
        "★★ RMSNorm and residuals",
        "Show that RMSNorm without $\\epsilon$ is invariant to multiplying one row by a "
        "positive constant. Then explain how the residual equation creates an identity "
        "gradient path.",
    ),
    "16.4": (
        "★★★ Dropout and mixed precision",
        "Implement inverted dropout and a tiny mixed-precision demo: show that fp16 overflows "
        "on large values where rounded bfloat16 remains finite, and show how loss scaling "
        "recovers a tiny fp16 gradient.",
    ),
}
"""Exercise number -> (title with its difficulty stars, the chapter's question, Markdown)."""


def exercise_question(number: str) -> str:
    """The chapter's question of Exercise `number`, with its title, as Markdown.

    Raises
    ------
    ValueError
        For another number; the message lists the available ones.

    Examples
    --------
    >>> exercise_question("16.2").splitlines()[0]
    'Exercise 16.2 ★★ LayerNorm backward'
    """
    if number not in QUESTIONS:
        raise ValueError(f"exercise must be one of {', '.join(QUESTIONS)}; got {number!r}")
    title, question = QUESTIONS[number]
    return f"Exercise {number} {title}\n\n{question}"


def _ex_16_1() -> str:
    rng = np.random.default_rng(0)
    x = rng.normal(3.0, 2.0, (4, 5))  # B,D
    mean_bn, mean_ln = x.mean(axis=0), x.mean(axis=1, keepdims=True)  # D ; B,1
    bn_full, _ = batch_norm_forward(x, None, None, None, None, True)
    bn_pair, _ = batch_norm_forward(x[:2], None, None, None, None, True)
    ln_full, _ = layer_norm_forward(x, None, None)
    ln_pair, _ = layer_norm_forward(x[:2], None, None)
    running_mean, running_var = np.zeros(5), np.ones(5)
    for _ in range(50):
        batch = rng.normal(3.0, 2.0, (4, 5))
        batch_norm_forward(batch, None, None, running_mean, running_var, True)
    single = x[:1]
    eval_out, _ = batch_norm_forward(single, None, None, running_mean, running_var, False)
    return "\n".join(
        [
            "Exercise 16.1: train vs inference statistics (x has shape B x d = 4 x 5)",
            "",
            f"BatchNorm reduces axis 0 (the batch): one mean per feature, shape {mean_bn.shape}",
            f"LayerNorm reduces axis 1 (the features): one mean per example, shape {mean_ln.shape}",
            "",
            "Row 0 normalised inside the batch of 4 and inside a batch of its first 2 rows:",
            f"  BatchNorm (training) max difference: {np.max(np.abs(bn_full[0] - bn_pair[0])):.3f}"
            "  <- depends on the other rows",
            f"  LayerNorm            max difference: {np.max(np.abs(ln_full[0] - ln_pair[0])):.1e}"
            "  <- the row alone decides",
            "",
            "At inference a single example has no batch: BatchNorm must use running statistics",
            f"accumulated in training (mean ~ {running_mean.round(2)}), e.g. row 0 ->",
            f"  {eval_out[0].round(3)}",
            "LayerNorm needs none: it computes the same per-example statistics in both modes.",
        ]
    )


def _ex_16_2() -> str:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 6))  # B,D
    gamma, beta = rng.uniform(0.5, 1.5, 6), rng.standard_normal(6)
    dout = rng.standard_normal((3, 6))  # B,D
    _, cache = layer_norm_forward(x, gamma, beta, eps=1e-5)
    dx_lib, _, _ = layer_norm_backward(dout, cache)
    # derived formula (16.3): s = sqrt(var + eps), xhat = (x - mu)/s, g = dout * gamma
    mu = x.mean(axis=1, keepdims=True)
    s = np.sqrt(((x - mu) ** 2).mean(axis=1, keepdims=True) + 1e-5)
    xhat = (x - mu) / s
    g = dout * gamma
    mean_g, mean_gx = g.mean(axis=1, keepdims=True), (g * xhat).mean(axis=1, keepdims=True)
    dx_formula = (g - mean_g - xhat * mean_gx) / s
    h = 1e-6
    dx_fd = np.zeros_like(x)
    for idx in np.ndindex(*x.shape):
        xp, xm = x.copy(), x.copy()
        xp[idx] += h
        xm[idx] -= h
        lp = np.sum(dout * layer_norm_forward(xp, gamma, beta, eps=1e-5)[0])
        lm = np.sum(dout * layer_norm_forward(xm, gamma, beta, eps=1e-5)[0])
        dx_fd[idx] = (lp - lm) / (2 * h)
    return "\n".join(
        [
            "Exercise 16.2: LayerNorm backward (16.3) against finite differences (float64)",
            "",
            "dx = (g - mean(g) - xhat * mean(g * xhat)) / s,  g = dout * gamma",
            f"  max |formula - central differences (h = 1e-6)| = "
            f"{np.max(np.abs(dx_formula - dx_fd)):.2e}",
            f"  max |formula - layer_norm_backward|            = "
            f"{np.max(np.abs(dx_formula - dx_lib)):.2e}",
            f"  row sums of dx: {dx_formula.sum(axis=1)}  (zero: shifting a row changes nothing)",
            "",
            "Two row means appear because x enters xhat through two row statistics:",
            f"  mean(g)        = {mean_g.ravel().round(4)}  from the mean mu (every x_j moves mu)",
            f"  mean(g * xhat) = {mean_gx.ravel().round(4)}  from the variance (every x_j moves s)",
        ]
    )


def _ex_16_3() -> str:
    rng = np.random.default_rng(2)
    x = rng.standard_normal((2, 8))  # B,D
    weight = rng.uniform(0.5, 1.5, 8)
    scaled = x.copy()
    scaled[0] *= 37.5  # one row times a positive constant
    tiny = 1e-300  # eps > 0 as the API requires, far below any mean square here
    y, _ = rms_norm_forward(x, weight, eps=tiny)
    y_scaled, _ = rms_norm_forward(scaled, weight, eps=tiny)
    with_eps, _ = rms_norm_forward(scaled * 1e-4, weight, eps=1e-2)
    block = Residual(Linear(8, 8, rng=rng, dtype=np.float64), RMSNorm(8, dtype=np.float64), "pre")
    block.sublayer.weight.data[...] = 0.0  # F(x) = 0: only the identity path remains
    block.sublayer.bias.data[...] = 0.0
    block.forward(x)
    dout = rng.standard_normal((2, 8))
    dx = block.backward(dout)
    return "\n".join(
        [
            "Exercise 16.3: RMSNorm scale invariance and the residual identity path",
            "",
            "RMSNorm(c x) = gamma * c x / sqrt(mean((c x)^2)) = gamma * x / sqrt(mean(x^2)), c > 0",
            f"  row 0 scaled by 37.5: max |change| = {np.max(np.abs(y_scaled - y)):.1e}"
            " (eps = 1e-300)",
            f"  with eps = 1e-2 and a row scaled to tiny values the invariance breaks: "
            f"max |change| = {np.max(np.abs(with_eps[0] - y[0])):.2f}",
            "",
            "Residual x_{l+1} = x_l + F(Norm(x_l)) has Jacobian I + dF/dx: the gradient keeps",
            "an identity path. With F's weights zeroed (pre-norm Residual of normlab.nn):",
            f"  max |dx - dout| = {np.max(np.abs(dx - dout)):.1e}  (dx == dout exactly: "
            f"{bool(np.array_equal(dx, dout))})",
        ]
    )


def _ex_16_4() -> str:
    from normlab.precision import (
        fp16_overflows_but_bfloat16_keeps_range,
        loss_scaled_gradient,
    )

    rng = np.random.default_rng(3)
    x = np.full(200_000, 2.0)
    out, keep = inverted_dropout(x, 0.25, rng)
    layer = Dropout(0.25, rng)
    layer.eval()
    eval_same = bool(np.array_equal(layer(x), x))
    fp16, bf16 = fp16_overflows_but_bfloat16_keeps_range()
    g = np.array([1e-8, 3e-9], dtype=np.float32)
    plain = g.astype(np.float16).astype(np.float32)
    recovered = loss_scaled_gradient(g, 2.0**16)
    return "\n".join(
        [
            "Exercise 16.4: inverted dropout and a tiny mixed-precision demo",
            "",
            "Inverted dropout, p = 0.25, on 200000 copies of 2.0 (kept values become 2/0.75):",
            f"  kept fraction {keep.mean():.4f} (expected 0.75), mean {out.mean():.4f} "
            f"(expected 2.0)",
            f"  nn.Dropout(0.25) in eval mode returns its input unchanged: {eval_same}",
            "",
            "Range: [1e5, 1e30] stored in float16 and in bfloat16:",
            f"  float16  -> {fp16}  (largest finite float16 is 65504)",
            f"  bfloat16 -> {bf16}  (8 exponent bits, like float32)",
            "",
            f"Loss scaling: gradients {g} stored in float16",
            f"  without scaling -> {plain}  (below fp16's smallest subnormal 6e-8: flushed)",
            f"  scaled by 2^16, stored in fp16, unscaled in fp32 -> {recovered}",
        ]
    )


EXERCISES: dict[str, Callable[[], str]] = {
    "16.1": _ex_16_1,
    "16.2": _ex_16_2,
    "16.3": _ex_16_3,
    "16.4": _ex_16_4,
}
"""Exercise number -> the function that computes its solution's text."""


def exercise_text(number: str) -> str:
    """The printed demonstration of Exercise `number` ("16.1" ... "16.4").

    Raises
    ------
    ValueError
        For another number; the message lists the available ones.
    """
    if number not in EXERCISES:
        raise ValueError(f"exercise must be one of {', '.join(EXERCISES)}; got {number!r}")
    with use_backend("numpy"):  # tiny arrays: the references are the fast path
        return EXERCISES[number]()
