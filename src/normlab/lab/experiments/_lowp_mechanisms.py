r"""Mechanism checks of the NVFP4 recipe that resolve at any size (needs torch).

Used by `normlab.lab.experiments.lowp_training`. The training comparison there cannot
resolve small losses at the lab's scale; these three checks measure, through the public
API (`QuantLinear` with an `NVFP4Recipe`, `random_hadamard_transform`), the three parts of
the recipe that NVIDIA 2025 (section 4) describes and ablates:

* stochastic rounding of gradients is unbiased: a `QuantLinear` with the identity as weight
  returns its quantised gradient as the input gradient, $dx = q(dy)\,I$. A gradient block
  $[6, v, \dots, v]$ maps onto the E2M1 grid one to one (its amax 6 sets the block scale),
  and $v = 2.4$ lies between the grid points 2 and 3: stochastic rounding gives 2 or 3 with
  mean 2.4, nearest always gives 2 (bias $-0.4$). Criterion: over the draws of several
  backward calls, the stochastic mean is within 4 standard errors of $v$, and nearest's
  bias is beyond that bound;
* the Hadamard transform spreads an injected outlier: blocks of 16 Gaussian values with one
  value of 100 have a crest factor $\max|x| / \mathrm{rms}(x)$ of about 4 ($\sqrt{16}$);
  after the 16-point random Hadamard transform about 1. Criterion: median crest factor
  after $\le$ 1.5 and at most half the one before, with the norm preserved (the transform
  is orthogonal; relative error $\le 10^{-5}$);
* 16x16 weight tiles make the forward and dgrad weights identical: with $x = I$ the forward
  returns $y = q_K(W)^T$, and with $dy = I$ the backward returns $dx = q_N(W)$ (both
  identities quantise exactly). With 16x16 tiles both are the same tile-quantised W; with
  1x16 blocks along each GEMM's contraction they differ.
"""

from __future__ import annotations

import importlib
import math
from typing import Any

import numpy as np

from normlab.lab.result import Check

__all__ = ["mechanism_checks"]

_V, _GRID_LOW = 2.4, 2.0  # a gradient value between the E2M1 points 2 and 3
_SR_SES = 4.0  # stochastic mean within this many standard errors of v
_OUTLIER, _CREST_MAX = 100.0, 1.5
_SRC = "NVIDIA 2025, section 4 (mechanism)"


def _sr_draws(torch: Any, nt: Any, stochastic: bool, rows: int, calls: int) -> np.ndarray:
    """The quantised values of v in the input gradients of `calls` backward passes."""
    layer = nt.QuantLinear(16, 16, bias=False, recipe=nt.NVFP4Recipe(
        stochastic_gradients=stochastic, seed=7))
    with torch.no_grad():
        layer.weight.copy_(torch.eye(16))
    dy = torch.full((rows, 16), _V)  # M,N
    dy[:, 0] = 6.0  # the block's amax: one block scale maps the grid one to one
    out = []
    for _ in range(calls):
        x = torch.ones(rows, 16, requires_grad=True)  # M,K
        layer(x).backward(dy)
        out.append(x.grad[:, 1:].reshape(-1).numpy().astype(np.float64))
    return np.concatenate(out)


def _sr_check(torch: Any, nt: Any, rows: int, calls: int) -> Check:
    sr = _sr_draws(torch, nt, True, rows, calls)
    rn = _sr_draws(torch, nt, False, rows, calls)
    se = float(np.std(sr, ddof=1) / math.sqrt(sr.size))
    bias_sr, bias_rn = float(sr.mean() - _V), float(rn.mean() - _V)
    bound = _SR_SES * se
    return Check(
        _SRC, "Stochastic rounding of the gradients is unbiased; round-to-nearest is not.",
        f"v = {_V} on the E2M1 grid, {sr.size} draws: |mean(SR) - v| <= {_SR_SES:g} standard "
        "errors, |mean(nearest) - v| above that bound",
        f"SR bias {bias_sr:+.4f} (bound {bound:.4f}), nearest bias {bias_rn:+.4f}",
        abs(bias_sr) <= bound < abs(bias_rn),
        {"sr_bias": bias_sr, "nearest_bias": bias_rn, "se": se, "draws": int(sr.size)})


def _crest(a: Any) -> Any:
    return a.abs().amax(-1) / a.pow(2).mean(-1).sqrt()


def _hadamard_check(torch: Any, nt: Any, blocks: int, seed: int) -> Check:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(blocks, 16, generator=gen, dtype=torch.float64)  # G,16
    where = torch.randint(0, 16, (blocks,), generator=gen)
    x[torch.arange(blocks), where] = _OUTLIER
    y = nt.random_hadamard_transform(x, 16, seed=seed)  # G,16
    before, after = float(_crest(x).median()), float(_crest(y).median())
    norm_err = float(((y.norm(dim=-1) - x.norm(dim=-1)).abs() / x.norm(dim=-1)).max())
    ok = after <= _CREST_MAX and after <= before / 2 and norm_err <= 1e-5
    return Check(
        _SRC, "The random Hadamard transform spreads an outlier over its block of 16.",
        f"{blocks} blocks of 16 N(0, 1) values with one value {_OUTLIER:g}: median crest "
        f"factor max|x|/rms(x) after <= {_CREST_MAX} and <= half the one before; norms kept "
        "(relative error <= 1e-5)",
        f"crest factor {before:.2f} -> {after:.2f}; norm error {norm_err:.1e}", ok,
        {"crest_before": before, "crest_after": after, "norm_error": norm_err})


def _tile_weights(torch: Any, nt: Any, two_d: bool, w: Any) -> tuple[Any, Any]:
    """(forward weight, dgrad weight) a QuantLinear uses, read through x = I and dy = I."""
    n = w.shape[0]
    layer = nt.QuantLinear(n, n, bias=False, recipe=nt.NVFP4Recipe(two_d_weights=two_d))
    with torch.no_grad():
        layer.weight.copy_(w)
    x = torch.eye(n, requires_grad=True)  # M,K with M = K = N
    y = layer(x)  # = q_K(W)^T
    y.backward(torch.eye(n))
    return y.detach().t(), x.grad  # q_K(W), q_N(W)


def _tiles_check(torch: Any, nt: Any, seed: int) -> Check:
    w = torch.randn(64, 64, generator=torch.Generator().manual_seed(seed))
    f2, d2 = _tile_weights(torch, nt, True, w)
    f1, d1 = _tile_weights(torch, nt, False, w)
    diff2 = float((f2 - d2).abs().max())
    diff1 = float((f1 - d1).ne(0).float().mean())
    return Check(
        _SRC, "16x16 weight tiles make the forward and dgrad weights identical; 1x16 blocks "
        "along each GEMM's contraction do not.",
        "a 64x64 Gaussian W: max |q_fwd(W) - q_dgrad(W)| = 0 with 16x16 tiles, > 0 for a "
        "share of the entries with 1x16 blocks",
        f"16x16: max difference {diff2:.3g}; 1x16: {100 * diff1:.1f}% of entries differ",
        diff2 == 0.0 and diff1 > 0.0, {"max_diff_2d": diff2, "share_differ_1d": diff1})


def mechanism_checks(seed: int, rows: int = 256, calls: int = 8) -> list[Check]:
    """The three checks of the module docstring (torch imported by the caller)."""
    torch = importlib.import_module("torch")
    nt = importlib.import_module("normlab.torch")
    return [_sr_check(torch, nt, rows, calls), _hadamard_check(torch, nt, 4096, seed),
            _tiles_check(torch, nt, seed)]
