"""Ioffe & Szegedy 2015, Figure 1: a sigmoid MLP trained with and without BatchNorm.

Contract: `ioffe_mlp` trains two copies of the same 3-hidden-layer sigmoid MLP (the
paper: 3 fully connected hidden layers of 100 sigmoid units, MNIST, batch 60) on a
synthetic 10-class task, one with `nn.BatchNorm` before every sigmoid, with plain SGD
from the same initial weights and the same batches; it returns, at regular checkpoints,
the test accuracy (eval mode) and the 15th, 50th and 85th percentiles of the input of one
sigmoid unit of the last hidden layer on a fixed probe batch (the paper's Figure 1(b, c)).
With BatchNorm that input is the BatchNorm output (training-mode statistics of the probe
batch, computed without touching the running statistics). Shapes: B batch, F features,
H hidden units, K classes, C checkpoints.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from normlab.nn import BatchNorm, Linear, Module, Sequential, softmax_cross_entropy
from normlab.nn.optim import SGD

__all__ = ["PERCENTILES", "ioffe_figure", "ioffe_mlp", "median_drift"]

PERCENTILES = (15, 50, 85)
_F, _H, _K, _BATCH = 20, 64, 10, 60
_LR = 0.5  # plain SGD; the same for both networks
_UNIT = 0  # the sigmoid unit of the last hidden layer that is followed


class _Sigmoid(Module):
    """sigma(x) = 1 / (1 + exp(-x)); backward dout * s (1 - s) (lab-only helper)."""

    def forward(self, x: Any) -> np.ndarray:
        s = 0.5 * (1.0 + np.tanh(0.5 * np.asarray(x)))  # = 1/(1+e^-x), no overflow
        self._save((s,))
        return s

    def backward(self, dout: np.ndarray) -> np.ndarray:
        (s,) = self._take()
        return np.asarray(dout) * s * (1.0 - s)


def _task(rng: np.random.Generator, n: int) -> tuple[np.ndarray, np.ndarray, Any]:
    """Inputs (n, F) and labels from a random two-layer teacher (argmax of K scores)."""
    w1 = rng.standard_normal((_F, 32)) / np.sqrt(_F)
    w2 = rng.standard_normal((32, _K)) / np.sqrt(32)
    x = rng.standard_normal((n, _F))  # n,F
    return x, np.argmax(np.tanh(x @ w1) @ w2, axis=1), (w1, w2)


def _net(batchnorm: bool, seed: int) -> tuple[Sequential, list[Module]]:
    """The MLP and its modules in order (Linear, [BatchNorm], sigmoid) x 3, Linear."""
    rng = np.random.default_rng([seed, 7])  # same weights for both networks
    layers: list[Module] = []
    fan_in = _F
    for _ in range(3):
        layers.append(Linear(fan_in, _H, rng=rng, init="xavier_normal", dtype=np.float64))
        if batchnorm:
            layers.append(BatchNorm(_H, dtype=np.float64))
        layers.append(_Sigmoid())
        fan_in = _H
    layers.append(Linear(_H, _K, rng=rng, init="xavier_normal", dtype=np.float64))
    return Sequential(*layers), layers


def _sigmoid_input(layers: list[Module], probe: np.ndarray) -> np.ndarray:
    """Input of the followed unit on the probe batch (running statistics untouched)."""
    h = probe
    for mod in layers[:-2]:  # up to the last hidden layer's pre-sigmoid output
        if isinstance(mod, BatchNorm):
            saved = (mod.running_mean.copy(), mod.running_var.copy())
            mod.train()
            h = mod.forward(h)
            mod.running_mean[...], mod.running_var[...] = saved
        else:
            h = mod.forward(h)
    return np.asarray(h)[:, _UNIT]  # B


def ioffe_mlp(seed: int, steps: int, checkpoints: int) -> dict[str, Any]:
    """Train both networks; per network `accuracy` (C,) and `percentiles` (C, 3)."""
    rng = np.random.default_rng([seed, 8])
    x_all, y_all, _ = _task(rng, 4000 + _BATCH * steps)
    x_test, y_test = x_all[:2000], y_all[:2000]
    probe = x_all[2000:4000]  # fixed probe batch for the percentiles
    x_train, y_train = x_all[4000:], y_all[4000:]
    at = np.unique(np.linspace(0, steps, checkpoints + 1).astype(int))  # C
    out: dict[str, Any] = {"steps": at.tolist()}
    for batchnorm in (False, True):
        net, layers = _net(batchnorm, seed)
        opt = SGD(net.parameters(), lr=_LR)
        acc, pct = [], []
        for t in range(steps + 1):
            if t in at:
                net.eval()
                pred = np.argmax(net.forward(x_test), axis=1)
                acc.append(float(np.mean(pred == y_test)))
                pct.append(np.percentile(_sigmoid_input(layers, probe), PERCENTILES))
                net.train()
            if t == steps:
                break
            xb = x_train[t * _BATCH : (t + 1) * _BATCH]  # B,F
            yb = y_train[t * _BATCH : (t + 1) * _BATCH]  # B
            net.zero_grad()
            _, dlogits = softmax_cross_entropy(net.forward(xb), yb)
            net.backward(dlogits)
            opt.step()
        key = "bn" if batchnorm else "plain"
        out[key] = {"accuracy": np.array(acc), "percentiles": np.array(pct)}
    return out


def median_drift(percentiles: np.ndarray) -> float:
    """Largest move of the median from the first checkpoint after step 0, in spreads.

    `max_t |p50_t - p50_1| / (p85_t - p15_t)` over checkpoints t >= 1 (C, 3 input).
    """
    p = np.asarray(percentiles)[1:]  # C-1,3
    return float(np.max(np.abs(p[:, 1] - p[0, 1]) / (p[:, 2] - p[:, 0])))


def ioffe_figure(out: dict[str, Any]) -> Any:
    """Figure 1 of the paper: test accuracy, and the followed unit's input percentiles."""
    from normlab.lab.plotting import new_figure

    fig, (ax0, ax1, ax2) = new_figure(1, 3, width=4.4, height=3.8)
    steps = np.array(out["steps"])
    ax0.plot(steps, out["plain"]["accuracy"], "k--o", ms=3, label="without BatchNorm")
    ax0.plot(steps, out["bn"]["accuracy"], "-s", color="tab:blue", ms=3, label="with BatchNorm")
    ax0.set(xlabel="training step", ylabel="test accuracy", title="(a) accuracy")
    ax0.legend(fontsize=8)
    for ax, key, title in ((ax1, "plain", "(b) without BatchNorm"),
                           (ax2, "bn", "(c) with BatchNorm")):
        p = out[key]["percentiles"]  # C,3
        for j, (q, ls) in enumerate(zip(PERCENTILES, (":", "-", "--"), strict=True)):
            ax.plot(steps, p[:, j], ls=ls, color="tab:blue" if key == "bn" else "k",
                    label=f"{q}th percentile")
        ax.set(xlabel="training step", ylabel="input of one last-layer sigmoid", title=title)
        ax.legend(fontsize=8)
    return fig
