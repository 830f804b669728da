"""Delayed-scaling updates against Transformer Engine's formulas, written out independently.

Oracles: the fused update is re-stated here as TE's CUDA kernel loop
(``delayed_scaling.cu``: per slot ``a = h[i + 1]`` or the last amax, ``amax = fmaxf(amax,
a)``, the write-back, and the roll skipped when the last amax is 0), element by element in
float32; the unfused update is TE's own torch code path (``fp8.py``,
``_default_get_amax_and_update_history`` / ``_default_sf_compute``) re-stated with torch
ops. Both are compared bit for bit (float32 scales and histories) on random traces with
NaN, inf and 0 amaxes, history lengths 1, 2, 4, 1024, both amax algorithms, margins -1,
0, 2, 24, 40 and both roles, plus the traces quoted in the issue.
"""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest

from normlab.precision.scaled.fp8_scaling import DelayedScaling, Fp8Meta, quantize_current_scaling

torch = pytest.importorskip("torch")

F32 = np.float32
F32_MAX = F32(np.finfo(np.float32).max)


def _fmaxf(a, b):
    """C's fmaxf: a NaN operand is ignored."""
    if math.isnan(a):
        return b
    if math.isnan(b):
        return a
    return max(a, b)


def _te_scale(amax, prev, scaled_max):
    with np.errstate(over="ignore", under="ignore"):
        s = F32(scaled_max / amax) if (np.isfinite(amax) and amax > 0) else F32(prev)
    s = F32_MAX if np.isinf(s) else s
    return max(s, F32(2.0**-127))  # normlab's one documented deviation (underflow)


def te_fused(h, prev, fp8_max, margin, algo):
    """TE 2.x delayed_scaling.cu, one tensor, written as the kernel's loop."""
    h = [F32(v) for v in h]
    n, last, amax, new = len(h), h[0], F32(0.0), list(h)
    if last != 0:
        for i in range(n):
            a = h[i + 1] if i < n - 1 else last
            amax = F32(_fmaxf(amax, a))
            new[i] = a if i > 0 else F32(0.0)
    if algo == "most_recent":
        amax = last
    scaled_max = F32(fp8_max) * F32(2.0) ** F32(-margin)  # std::pow(2.f, -margin)
    return np.array(new, np.float32), _te_scale(amax, prev, scaled_max)


def te_unfused(h, prev, fp8_max, margin, algo):
    """TE's NVTE_UNFUSED_FP8_UPDATE path, with torch as TE writes it."""
    t = torch.tensor(np.asarray(h, np.float32))
    amax = torch.max(t, dim=0).values if algo == "max" else t[0].clone()
    t = torch.roll(t, -1, 0) if t.shape[0] > 1 else t.clone()
    t[0] = 0.0
    scale = torch.tensor(prev, dtype=torch.float32)
    sf = (fp8_max / amax) / (2**margin)
    sf = torch.where(amax > 0.0, sf, scale)
    sf = torch.where(torch.isfinite(amax), sf, scale)
    sf = torch.where(torch.isinf(sf), torch.full_like(sf, float(F32_MAX)), sf)
    return t.numpy(), max(F32(sf.item()), F32(2.0**-127))


def _amaxes(rng, steps):
    """float32 amaxes over a wide range with NaN, inf and 0 sprinkled in."""
    a = np.exp2(rng.uniform(-30, 30, steps)).astype(np.float32)
    special = rng.choice([np.nan, np.inf, 0.0, 1e-40, 3e38], steps)
    pick = rng.random(steps) < 0.3
    return np.where(pick, special, a).astype(np.float32)


@pytest.mark.parametrize("update", ["fused", "unfused"])
@pytest.mark.parametrize("length", [1, 2, 4, 1024])
@pytest.mark.parametrize("algo", ["max", "most_recent"])
def test_traces_match_te(update, length, algo, rng):
    oracle = te_fused if update == "fused" else te_unfused
    for margin in (-1, 0, 2, 24, 40):
        for role in ("forward", "backward"):
            meta = Fp8Meta(DelayedScaling(margin=margin, amax_history_len=length,
                                          amax_compute_algo=algo, update=update), role)
            h, scale = np.zeros(length, np.float32), F32(1.0)
            for a in _amaxes(rng, 12 if length < 1024 else 4):
                with np.errstate(invalid="ignore", over="ignore"):
                    meta.quantize(np.array([a, a / 2], np.float32))
                h[0] = a  # slot 0 is 0 at the start of every step (zeroed or not rolled)
                meta.update()
                h, scale = oracle(h, scale, meta.fmt.max, margin, algo)
                assert meta.scale == float(scale), (update, length, algo, margin, role, a)
                np.testing.assert_array_equal(meta.amax_history, h)
                assert meta.scale_inv == float(F32(1.0) / scale)


def _meta(history, prev, update="fused", margin=0, algo="max"):
    meta = Fp8Meta(DelayedScaling(margin=margin, amax_history_len=len(history),
                                  amax_compute_algo=algo, update=update))
    meta.amax_history = np.array(history, np.float32)
    meta.scale = prev
    meta.update()
    return meta


def test_issue_traces_by_hand():
    # NaN skipped: max(5, NaN) = 5, 448 / 5 = 89.6 in float32; unfused keeps 224
    assert _meta([5.0, np.nan], 224.0).scale == float(F32(448) / F32(5))
    assert _meta([5.0, np.nan], 224.0, "unfused").scale == 224.0
    # a zero step keeps the scale and does not roll (unfused: 448 / 1e-3 and rolls)
    m = _meta([0.0, 1e-3], 128.0)
    assert m.scale == 128.0 and m.amax_history.tolist() == [0.0, float(F32(1e-3))]
    u = _meta([0.0, 1e-3], 128.0, "unfused")
    assert u.scale == float(F32(448) / F32(1e-3)) and u.amax_history.tolist() == [0.0, 0.0]
    # margin 24, amax 1e-40: (448 * 2^-24) / 1e-40 = 2.6703024e35; unfused overflows first
    assert F32(_meta([1e-40], 1.0, margin=24).scale) == F32(2.6703024e35)
    assert _meta([1e-40], 1.0, "unfused", margin=24).scale == float(F32_MAX)
    assert _meta([1e-40], 1.0).scale == float(F32_MAX)  # 448 / 1e-40 = inf -> FLT_MAX


def test_underflowing_scale_stays_usable():
    # margin 31, amax 3e38: (448 * 2^-31) / 3e38 underflows to 0 in float32 (TE stores 0);
    # normlab keeps 2^-127 so the next cast and its dequantisation are finite
    for update in ("fused", "unfused"):
        m = _meta([3e38], 1.0, update, margin=31)
        assert m.scale == 2.0**-127
        t = m.quantize(np.array([3e38, 1e38], np.float32))
        assert np.isfinite(t.dequantize()).all()


def test_state_dict_round_trips_through_savez_and_pickle(tmp_path):
    meta = Fp8Meta(DelayedScaling(amax_history_len=4), "backward")
    for a in (2.0, 8.0, 0.5):
        meta.quantize(np.array([a], np.float32))
        meta.update()
    state = meta.state_dict()
    np.savez(tmp_path / "m.npz", **state)  # NumPy < 2.1 has no allow_pickle here
    with np.load(tmp_path / "m.npz", allow_pickle=False) as f:
        loaded = dict(f)
    for source in (loaded, pickle.loads(pickle.dumps(state))):
        other = Fp8Meta(DelayedScaling(amax_history_len=4), "backward")
        other.load_state_dict(source)
        assert (other.scale, other.scale_inv) == (meta.scale, meta.scale_inv)
        np.testing.assert_array_equal(other.amax_history, meta.amax_history)
        other.quantize(np.array([3.0], np.float32))
        meta2 = pickle.loads(pickle.dumps(meta))
        meta2.quantize(np.array([3.0], np.float32))
        other.update()
        meta2.update()
        assert other.scale == meta2.scale


@pytest.mark.parametrize(
    ("change", "exc", "match"),
    [
        ({"amax_history": np.zeros(3, np.float32)}, ValueError, r"shape \(4,\)"),
        ({"scale": 0.0}, ValueError, "finite float32 > 0"),
        ({"scale": 1e39}, ValueError, "finite float32 > 0"),
        ({"scale": "2"}, TypeError, "real number"),
        ({"role": "forward"}, ValueError, "role"),
        ({"amax_history_len": 8}, ValueError, "amax_history_len"),
        ({"amax_history": np.array(["a"] * 4)}, TypeError, "amax_history"),
    ],
)
def test_load_validates_everything_before_changing_anything(change, exc, match):
    meta = Fp8Meta(DelayedScaling(amax_history_len=4), "backward")
    meta.quantize(np.array([2.0], np.float32))
    meta.update()
    before = (meta.amax_history.copy(), meta.scale, meta.scale_inv)
    state = {**meta.state_dict(), "scale": 7.0, **change}
    with pytest.raises(exc, match=match):
        meta.load_state_dict(state)
    np.testing.assert_array_equal(meta.amax_history, before[0])
    assert (meta.scale, meta.scale_inv) == before[1:]
    with pytest.raises(ValueError, match="with the key 'role'"):
        meta.load_state_dict({"amax_history": before[0]})


def test_current_scaling_epsilon_and_power_of_two():
    # amax_epsilon lifts a small amax (TE: amax = max(amax, eps)); zeros then get 448 / eps
    z = quantize_current_scaling(np.zeros(3, np.float32), amax_epsilon=1e-3)
    assert z.scale == float(F32(448) / F32(1e-3))
    assert quantize_current_scaling(np.zeros(3, np.float32)).scale == 1.0
    # power of two: the float32 mantissa is cleared. 448 / 3 = 149.3 -> 128; 448 / 0.7 =
    # 640 -> 512; 448 / 1e-40 = inf -> FLT_MAX -> 2^127
    for amax, want in ((3.0, 128.0), (0.7, 512.0), (1e-40, 2.0**127), (0.5, 512.0)):
        t = quantize_current_scaling(np.array([amax], np.float32), power_of_2_scales=True)
        assert t.scale == want, amax
    with pytest.raises(ValueError, match="amax_epsilon"):
        quantize_current_scaling(np.ones(2, np.float32), amax_epsilon=-1.0)
    with pytest.raises(TypeError, match="power_of_2_scales"):
        quantize_current_scaling(np.ones(2, np.float32), power_of_2_scales=1)


def test_big_endian_input_is_scaled_in_float64():
    # 1.0625 + 2^-40 times 1 sits just above the E4M3 tie 1.0625: float64 rounds it up to
    # 1.125; through float32 it becomes the tie and goes to the even 1.0
    from normlab.precision.scaled.fp8_scaling import fp8_quantize

    x = np.array([1.0625 + 2.0**-40], dtype=">f8")
    assert fp8_quantize(x, "e4m3", 1.0).data.tolist() == [1.125]
    assert fp8_quantize(x.astype(np.float32), "e4m3", 1.0).data.tolist() == [1.0]


def test_state_dict_through_normlab_checkpoint(tmp_path):
    from normlab import checkpoint

    meta = Fp8Meta(DelayedScaling(amax_history_len=4))
    meta.quantize(np.array([3.0], np.float32))
    meta.update()
    checkpoint.save(tmp_path / "c.npz", {"fp8": meta.state_dict()})
    other = Fp8Meta(DelayedScaling(amax_history_len=4))
    other.load_state_dict(checkpoint.load(tmp_path / "c.npz")["fp8"])
    assert other.scale == meta.scale and other.amax_history.tolist() == [0.0, 0.0, 0.0, 3.0]
