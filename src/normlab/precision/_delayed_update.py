"""Transformer Engine's two delayed-scaling updates, as pure functions on (history, scale).

Dimension letters: L amax history length.

Both take the history (L,) float32 after this step's amaxes were recorded into slot 0, the
previous scale, fp8_max, margin and the amax algorithm, and return (new history, new
scale) in float32. Neither mutates its input.

``"fused"`` (TE 2.x default; ``transformer_engine/common/recipe/delayed_scaling.cu``,
``kernel_bulk`` / ``amax_and_scale_update_kernel``, the after-reduction update that
``transformer_engine/pytorch/fp8.py`` calls through
``tex.fused_amax_and_scale_update_after_reduction``):

- ``last = h[0]``. If ``last != 0`` (NaN counts as nonzero) the history rolls (slot i <-
  slot i + 1, slot L - 1 <- last, slot 0 <- 0) and ``amax = fmaxf``-reduction, started at
  0, over every slot before the roll: a NaN is skipped (``fmaxf(a, NaN) = a``). If ``last == 0`` the
  history does not roll and the "max" reduction is never computed: amax = 0.
- ``"most_recent"``: amax = last.
- ``scale = (fp8_max * 2^-margin) / amax`` in float32 (``scaled_max`` is formed first)
  if amax is finite and > 0, else the previous scale; an infinite scale becomes FLT_MAX.

``"unfused"`` (``NVTE_UNFUSED_FP8_UPDATE=1``; ``transformer_engine/pytorch/fp8.py``,
``_default_get_amax_and_update_history`` and ``_default_sf_compute``, normlab's behaviour
before 0.2): amax = ``torch.max`` over the window (NaN propagates) or slot 0; the history
always rolls; ``scale = (fp8_max / amax) / 2^margin`` in float32, where torch evaluates
``python_float / tensor`` as ``reciprocal(tensor) * python_float``, so the quotient is
``float32(fp8_max * float32(1 / amax))``, rounded twice (an overflow of 1 / amax is inf,
then FLT_MAX); amax 0, inf or NaN keep the previous scale.

One deviation from both, for a case TE leaves broken: a scale below 2^-127 (float32
underflow, e.g. margin >= 31 with amax near FLT_MAX makes it 0) becomes 2^-127, the
smallest power of two whose float32 reciprocal is finite, so the next cast and its
dequantisation stay finite instead of dividing by zero.
"""

from __future__ import annotations

import numpy as np

__all__ = ["UPDATES", "fused_update", "scale_from_amax", "unfused_update"]

UPDATES = ("fused", "unfused")
F32_MAX = np.float32(np.finfo(np.float32).max)
MIN_SCALE = np.float32(2.0**-127)


def _finish(scale: np.float32) -> np.float32:
    """inf -> FLT_MAX (TE); below 2^-127 -> 2^-127 (see the module header)."""
    if np.isinf(scale):
        return F32_MAX
    return max(scale, MIN_SCALE)


def scale_from_amax(amax: float, previous: float, fp8_max: float, margin: int,
                    update: str = "fused") -> float:
    """The new float32 scale from one amax (previous kept for amax 0, inf or NaN)."""
    a = np.float32(amax)
    if not (np.isfinite(a) and a > 0):
        return float(np.float32(previous))
    with np.errstate(over="ignore", under="ignore"):
        if update == "fused":
            scaled_max = np.float32(np.ldexp(np.float32(fp8_max), -int(margin)))
            s = np.float32(scaled_max / a)
        else:
            q = np.float32(np.float32(fp8_max) * np.float32(np.float32(1.0) / a))
            s = np.float32(np.ldexp(q, -int(margin)))
    return float(_finish(s))


def fused_update(h: np.ndarray, previous: float, fp8_max: float, margin: int,
                 algo: str) -> tuple[np.ndarray, float]:
    """TE 2.x fused delayed-scaling update (see the module header): (history L, scale)."""
    last = np.float32(h[0])
    if last != 0:  # NaN != 0 is True: a NaN step rolls
        window = h[~np.isnan(h)]  # the kernel reduces over every slot before the roll
        amax = np.float32(max(0.0, float(window.max()))) if window.size else np.float32(0)
        rolled = np.roll(h, -1).astype(np.float32)  # L
        rolled[0] = 0.0
    else:
        rolled, amax = h.astype(np.float32, copy=True), np.float32(0)
    if algo == "most_recent":
        amax = last
    return rolled, scale_from_amax(float(amax), previous, fp8_max, margin, "fused")


def unfused_update(h: np.ndarray, previous: float, fp8_max: float, margin: int,
                   algo: str) -> tuple[np.ndarray, float]:
    """TE's unfused (``NVTE_UNFUSED_FP8_UPDATE``) update: (history L, scale)."""
    amax = float(np.max(h)) if algo == "max" else float(h[0])  # NaN propagates
    rolled = np.roll(h, -1).astype(np.float32)  # L
    rolled[0] = 0.0
    return rolled, scale_from_amax(amax, previous, fp8_max, margin, "unfused")
