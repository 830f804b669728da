"""The dense regressor of `normlab.lab.experiments.loss_scaling`, with fp16 rounding.

Dimension letters: B = batch, F = input features, H = hidden width, K = outputs per example.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from normlab.nn import GELU, Linear, Parameter
from normlab.precision import FLOAT16, quantize

__all__ = ["FEATURES", "HIDDEN", "HIDDEN_LAYERS", "DenseNet", "init_record", "layer_errors"]

FEATURES = 32
"""F, Gaussian inputs per example."""
HIDDEN = 32
"""H, the width of the hidden layers."""
HIDDEN_LAYERS = 2
"""GELU hidden layers before the linear head (GELU, not ReLU: see the experiment's docstring)."""


class DenseNet:
    """A GELU MLP with a wide linear head, a fixed output multiplier and an optional fp16
    rounding after every op.

    The output is `output_scale * head(h)`: a fixed multiplier (a power of two, so exact in
    fp16), not a parameter; the backward multiplies the loss gradient by it again.
    """

    def __init__(self, k: int, rng: np.random.Generator, output_scale: float = 1.0) -> None:
        self.output_scale = np.float32(output_scale)
        self.layers: list[Any] = []
        fan_in = FEATURES
        for _ in range(HIDDEN_LAYERS):  # He: N(0, 2 / fan_in); "normal" gives zero biases
            self.layers += [Linear(fan_in, HIDDEN, rng=rng, init="normal",
                                   std=math.sqrt(2.0 / fan_in)), GELU()]
            fan_in = HIDDEN
        self.layers.append(Linear(HIDDEN, k, rng=rng, init="normal",
                                  std=math.sqrt(2.0 / HIDDEN)))
        self.linears: list[Linear] = [lay for lay in self.layers if isinstance(lay, Linear)]
        self.params: list[Parameter] = [p for lay in self.layers for p in lay.parameters()]

    def forward(self, x: np.ndarray) -> np.ndarray:
        """The output in float32 (no rounding, no backward)."""
        h = x
        for lay in self.layers:
            h = lay.forward(h)
        return self.output_scale * h

    def loss_and_grads(self, x: np.ndarray, y: np.ndarray, scale: float, fp16: bool,
                       keep: list[np.ndarray] | None = None) -> float:
        """Forward and backward of `scale * 0.5 mean (f(x) - y)^2`; returns the loss.

        Gradients land in each parameter's `.grad`; `keep` collects every backward
        signal (the loss gradient, each activation gradient, each weight gradient).
        """
        rnd = (lambda a: quantize(a, FLOAT16)) if fp16 else (lambda a: a)
        for p in self.params:
            p.grad = None
        h = rnd(x)  # B,F
        for lay in self.layers:
            h = rnd(lay.forward(h))
        h = rnd(self.output_scale * h)  # B,K
        err = h.astype(np.float64) - y  # B,K
        with np.errstate(over="ignore", invalid="ignore"):  # overflow is what S may cause
            d = rnd(np.float32(scale) * (err / err.size).astype(np.float32))  # B,K
            signals = [d]
            d = rnd(self.output_scale * d)  # through the multiplier
            for lay in reversed(self.layers):
                d = rnd(np.asarray(lay.backward(d), dtype=np.float32))
                signals.append(d)
            for p in self.params:
                assert p.grad is not None
                p.grad = rnd(p.grad.astype(np.float32))
                signals.append(p.grad)
        if keep is not None:
            keep.extend(s.ravel().copy() for s in signals)
        return float(0.5 * np.mean(err**2))


def _weight_grads(net: DenseNet) -> list[np.ndarray]:
    grads = [lay.weight.grad for lay in net.linears]
    assert all(g is not None for g in grads)  # loss_and_grads fills every gradient
    return [np.asarray(g, dtype=np.float64) for g in grads]


def layer_errors(net: DenseNet, x: np.ndarray, y: np.ndarray, scale: float) -> list[float]:
    """||g16 / S - g32|| / ||g32|| of each layer's weight gradient at the net's weights.

    Both gradients are taken at the weights rounded to fp16 (the working copy a mixed-
    precision step would use), so the difference is the fp16 backward's alone; the net's
    weights are restored afterwards.
    """
    saved = [p.data for p in net.params]
    for p in net.params:
        p.data = quantize(p.data, FLOAT16)
    try:
        net.loss_and_grads(x, y, 1.0, fp16=False)
        g32 = _weight_grads(net)
        net.loss_and_grads(x, y, scale, fp16=True)
        g16 = [g / scale for g in _weight_grads(net)]
    finally:
        for p, data in zip(net.params, saved, strict=True):
            p.data = data
    return [float(np.linalg.norm(a - b) / np.linalg.norm(b)) for a, b in zip(g16, g32, strict=True)]


def init_record(net: DenseNet) -> dict[str, float]:
    """Each Linear's weight std over the He value sqrt(2 / fan_in), and the largest bias."""
    ratios = [float(lay.weight.data.std()) / math.sqrt(2.0 / lay.in_features)
              for lay in net.linears]
    biases = [float(np.max(np.abs(lay.bias.data))) for lay in net.linears
              if lay.bias is not None]
    return {"std_over_he": float(np.mean(ratios)), "max_abs_bias": max(biases, default=0.0)}
