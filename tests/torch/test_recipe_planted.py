"""Planted differences: a plausible bug in any one place makes the differential suite fail.

Each test monkeypatches one piece (a shared arithmetic function, a namespace method, a
NumPy or torch adapter, a QuantLinear method) with a plausible bug and asserts that the
differential harness reports a mismatch on the input that exercises it. A bug in a shared
piece changes the NumPy, torch and QuantLinear paths alike; the independent oracle catches
it. A bug in one adapter makes that path disagree with the others. The last two plant the
two bugs the old QuantLinear copy had (TE's unfused update instead of Fp8Meta's default
fused one; an MX operand that stays finite for a block holding an infinity).
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import recipe_differential as diff  # noqa: E402

import normlab.precision.scaled.mx as np_mx  # noqa: E402
import normlab.precision.scaled.nvfp4 as np_nvfp4  # noqa: E402
import normlab.torch.training.linear as tnn  # noqa: E402
from normlab.precision import Fp8DelayedRecipe  # noqa: E402
from normlab.precision.scaled import arithmetic as recipe_core  # noqa: E402
from normlab.precision.scaled import block_scales, scales  # noqa: E402
from normlab.precision.scaled import tiling as blocks  # noqa: E402
from normlab.precision.scaled.namespace import F32_MAX, NUMPY, ArrayNamespace  # noqa: E402
from normlab.precision.scaled.quantizers import Fp8BlockQuantizer, MXQuantizer  # noqa: E402
from normlab.torch import scaling as tscaling  # noqa: E402
from normlab.torch._fastround import round_elements  # noqa: E402
from normlab.torch.namespace import TORCH, TorchNamespace  # noqa: E402
from normlab.torch.training import _gemm, _operand_ops  # noqa: E402

FUSED = Fp8DelayedRecipe(amax_history_len=4, reduce_amax=False)
UNFUSED = Fp8DelayedRecipe(amax_history_len=4, update="unfused", reduce_amax=False)
MARGIN = Fp8DelayedRecipe(margin=2, amax_history_len=2, reduce_amax=False)
TRACE = diff.TRACES["zero_nan_inf"]


def _wrap(monkeypatch, module, name, make):
    """Replace module.name by make(original)."""
    monkeypatch.setattr(module, name, make(getattr(module, name)))


# --- shared arithmetic: all paths change, the oracle disagrees ---------------------------
def test_scale_overflow_not_clamped(monkeypatch):
    _wrap(monkeypatch, scales, "scale_from_amax",
          lambda f: lambda *a, **k: f(*a, **{**k, "value_for_inf": float("inf")}))
    assert diff.operand_mismatches("current", "all_tiny")


def test_margin_with_the_wrong_sign(monkeypatch):
    _wrap(monkeypatch, scales, "scale_from_amax",
          lambda f: lambda *a, **k: f(*a, **{**k, "margin": -k.get("margin", 0)}))
    assert diff.operand_mismatches("current_m3_eps_pow2", "spread")


def test_power_of_two_rounded_up(monkeypatch):
    def up(f):
        return lambda s, *, xp=None: f(s, xp=xp) * (xp or NUMPY).scalar(2.0, s)
    _wrap(monkeypatch, scales, "power_of_two_floor", up)
    assert diff.operand_mismatches("current_m3_eps_pow2", "spread")


def test_fused_update_computed_as_unfused(monkeypatch):
    _wrap(monkeypatch, scales, "delayed_update",
          lambda f: lambda *a, **k: f(*a, **{**k, "update": "unfused"}))
    assert diff.delayed_mismatches(FUSED, TRACE)


def test_nan_amax_not_recorded(monkeypatch):
    def drop_nan(f):
        def g(history, amax, *, xp=None):
            xp = xp or NUMPY
            a = xp.astype(amax, "float32")
            return f(history, xp.where(xp.isnan(a), xp.scalar(0.0, a), a), xp=xp)
        return g
    _wrap(monkeypatch, scales, "record_amax", drop_nan)
    assert diff.delayed_mismatches(UNFUSED, TRACE)


def test_mx_ocp_takes_an_infinity_for_a_large_amax(monkeypatch):
    def finite(f):
        def g(amax, fmt, rule, *, xp=None):
            xp = xp or NUMPY
            big = xp.scalar(F32_MAX, amax)
            return f(xp.where(xp.isinf(amax), xp.astype(big, "float64"), amax), fmt, rule, xp=xp)
        return g
    _wrap(monkeypatch, block_scales, "mx_scale_codes", finite)
    assert diff.operand_mismatches("mx_e4m3_e5m2", "inf_block")


def test_mx_round_up_rule_floors(monkeypatch):
    _wrap(monkeypatch, block_scales, "mx_scale_codes",
          lambda f: lambda amax, fmt, rule, *, xp=None: f(amax, fmt, "ocp", xp=xp))
    assert diff.operand_mismatches("mx_fp4_round_up", "spread")


def test_nvfp4_tensor_scale_dropped(monkeypatch):
    def no_s_dec(f):
        def g(*a, xp=None, **k):
            s_b, e_b, s_dec = f(*a, xp=xp, **k)
            return s_b, e_b, (xp or NUMPY).scalar(1.0, s_dec)
        return g
    _wrap(monkeypatch, block_scales, "nvfp4_scales", no_s_dec)
    assert diff.operand_mismatches("nvfp4_plain", "spread")


def test_blockwise_overflow_value_ignores_the_input_dtype(monkeypatch):
    _wrap(monkeypatch, block_scales, "blockwise_scales",
          lambda f: lambda *a, **k: f(*a, **{**k, "value_for_inf": F32_MAX}))
    assert diff.bf16_blockwise_mismatches("all_tiny")


def test_block_amax_of_signed_values(monkeypatch):
    def signed(x, block, *, xp=None, accelerate=True):
        xp = xp or NUMPY
        m = xp.max(blocks.tile(xp.work(x), block, xp=xp), axis=(2, 4))
        return xp.reshape(m, blocks.grid_shape(tuple(x.shape), block))
    monkeypatch.setattr(blocks, "block_amax", signed)
    assert diff.operand_mismatches("blockwise", "spread")


def test_padding_with_nonzero_values(monkeypatch):
    def ones_padded(x, block, *, xp=None):
        xp = xp or NUMPY
        A, R, C, r, c, nR, nC = blocks._dims(tuple(x.shape), block)
        a = xp.reshape(x, (A, R, C))
        widths = (0, nR * r - R, nC * c - C)
        inside = xp.pad_end(xp.full((A, R, C), 1.0, a), widths)  # 1 inside, 0 in padding
        padded = xp.pad_end(a, widths) + (xp.scalar(1.0, a) - inside) * xp.scalar(1e30, a)
        return xp.reshape(padded, (A, nR, r, nC, c))
    monkeypatch.setattr(blocks, "tile", ones_padded)
    assert diff.operand_mismatches("mx_e4m3_e5m2", "spread")


def test_mx_nan_blocks_not_marked(monkeypatch):
    def no_nan(f):
        def g(*a, xp, **k):
            elems, codes = f(*a, xp=xp, **k)
            return xp.where(xp.isnan(elems), xp.scalar(0.0, elems), elems), codes
        return g
    _wrap(monkeypatch, recipe_core, "mx_quantize_parts", no_nan)
    assert diff.operand_mismatches("mx_e4m3_e5m2", "nan_block")


# --- one backend's namespace ----------------------------------------------------------
def test_torch_max_skips_nan(monkeypatch):
    monkeypatch.setattr(TorchNamespace, "max", lambda self, x, axis: torch.amax(
        torch.nan_to_num(x, nan=-float("inf")), dim=axis))
    assert diff.operand_mismatches("mx_e4m3_e5m2", "nan_block")


def test_numpy_engine_ignores_saturation(monkeypatch):
    real = ArrayNamespace.quantize
    monkeypatch.setattr(ArrayNamespace, "quantize", lambda self, x, fmt, *, saturate, **k:
                        real(self, x, fmt, saturate=False, **k))
    assert diff.operand_mismatches("current", "inf_block")


def test_torch_input_max_is_always_float32s(monkeypatch):
    monkeypatch.setattr(TORCH, "input_max", lambda x: F32_MAX)
    assert diff.bf16_blockwise_mismatches("all_tiny")


# --- adapters ---------------------------------------------------------------------------
def test_numpy_mx_adapter_ignores_the_rule(monkeypatch):
    monkeypatch.setattr(np_mx, "mx_scale_rule", lambda rule: "ocp")
    assert diff.operand_mismatches("mx_e4m3_round_up", "spread")


def test_numpy_nvfp4_adapter_shifts_the_seed(monkeypatch):
    real = np_nvfp4.stochastic_source
    monkeypatch.setattr(np_nvfp4, "stochastic_source", lambda stochastic, rng, seed, bits, shape:
                        real(stochastic, rng, None if seed is None else seed + 1, bits, shape))
    assert diff.operand_mismatches("nvfp4", "spread")


def test_torch_meta_always_fused(monkeypatch):
    def update(self):
        r = self.recipe
        self.amax_history, self.scale = scales.delayed_update(
            self.amax_history, self.scale, self.fmt.max, margin=r.margin,
            amax_compute_algo=r.amax_compute_algo, update="fused", xp=TORCH)
        self.scale_inv = 1.0 / self.scale
    monkeypatch.setattr(tscaling.Fp8Meta, "update", update)
    assert diff.delayed_mismatches(UNFUSED, TRACE)


def _update_scales(margin_of=lambda r: r.margin, update_of=lambda r: r.update):
    """QuantLinear.update_scales with a planted margin or update rule."""
    def update_scales(self):
        r = self.recipe
        if not self.pending:
            return
        rows = []
        for i, role in enumerate(_gemm.ROLES):
            fmt = r.format_for("backward" if role == "dy" else "forward")
            rows.append(scales.delayed_update(
                self.amax_history[i], self.scale[i], fmt.max, margin=margin_of(r),
                amax_compute_algo=r.amax_compute_algo, update=update_of(r), xp=TORCH))
        self.amax_history.copy_(torch.stack([h for h, _ in rows]))
        self.scale.copy_(torch.stack([s for _, s in rows]))
        self.pending = False
    return update_scales


def test_layer_update_ignores_the_margin(monkeypatch):
    monkeypatch.setattr(tnn.QuantLinear, "update_scales", _update_scales(lambda r: 0))
    assert diff.delayed_mismatches(MARGIN, diff.TRACES["steps"])


def test_layer_records_a_signed_amax(monkeypatch):
    real = tnn.QuantLinear.operand_scale

    def signed(self, t, index):  # slot 0 gets the running max of t, not of |t|
        before = self.amax_history[index, 0].clone()
        out = real(self, t, index)
        if self.training:
            self.amax_history[index, 0] = torch.maximum(before, t.amax())
        return out
    monkeypatch.setattr(tnn.QuantLinear, "operand_scale", signed)
    assert diff.delayed_mismatches(FUSED, diff.TRACES["steps"])


def _replaced(family, **changes):
    """A wrapper of `_operand_ops.fake` that changes the fields of one quantizer family."""
    return lambda f: lambda t, q, **k: f(t, dataclasses.replace(q, **changes)
                                         if type(q) is family else q, **k)


def test_layer_mx_operand_ignores_the_rule(monkeypatch):
    _wrap(monkeypatch, _operand_ops, "fake", _replaced(MXQuantizer, rule="ocp"))
    assert diff.operand_mismatches("mx_fp4_round_up", "spread")


def test_layer_blockwise_operand_blocks_the_last_axis(monkeypatch):
    _wrap(monkeypatch, _operand_ops, "fake", _replaced(Fp8BlockQuantizer, axis=1))
    assert diff.operand_mismatches("blockwise", "spread")


def test_layer_hadamard_of_another_seed(monkeypatch):
    real = tnn.rht_matrix
    monkeypatch.setattr(tnn, "rht_matrix", lambda b, seed, **k: real(b, seed + 1, **k))
    assert diff.operand_mismatches("nvfp4", "spread")


def test_layer_stochastic_streams_swapped(monkeypatch):
    real = _operand_ops.stream_seed
    monkeypatch.setattr(_operand_ops, "stream_seed", lambda s, c, which: real(s, c, 1 - which))
    assert diff.operand_mismatches("nvfp4", "spread")


# --- the CPU fast path (numba operand kernels) against the shared arithmetic ----------
def test_fast_path_block_amax_doubled(monkeypatch):
    # only the fast path is wrong: the layer's CPU operands differ from every other path,
    # its torch-ops twin ("quantlinear_torch") agrees with the references
    from normlab.kernels import operand as kop

    real = kop._amax
    monkeypatch.setattr(kop, "_amax", lambda xb, ra, rb: real(xb, ra, rb) * np.float32(2))
    mismatches = diff.operand_mismatches("mx_e4m3_e5m2", "spread")
    assert mismatches and all(": quantlinear !=" in m for m in mismatches), mismatches


def test_fast_path_saved_codes_decoded_wrong(monkeypatch):
    # the decode loop off by one ulp: only wgrad's x (decoded from the saved codes) differs
    from normlab.kernels import operand as kop
    from normlab.kernels import operand_jit

    real = kop.launch

    def off(kern, n, *args):
        done = real(kern, n, *args)
        if kern is operand_jit.decode_blocks:
            args[-1].reshape(-1).view(np.uint32)[0] ^= np.uint32(1)
        return done

    monkeypatch.setattr(kop, "launch", off)
    for name in ("current", "nvfp4_plain", "bf16"):
        mismatches = diff.operand_mismatches(name, "spread")
        assert mismatches and all("/wgrad_x: quantlinear !=" in m for m in mismatches), \
            mismatches


def test_fast_path_bf16_read_as_its_upper_half(monkeypatch):
    # a bfloat16 model's operands widened wrongly (bits shifted by 15, not 16) in the view
    from normlab.torch.training import _operand_ops as oo

    real = oo.numpy_view

    def wrong(t):
        v = real(t)
        if v is None or t.dtype != torch.bfloat16:
            return v
        return (np.asarray(v).view(np.int16) >> 1).view(v.dtype)

    monkeypatch.setattr(oo, "numpy_view", wrong)
    assert diff.operand_mismatches("current", "spread", "bfloat16")


# --- the two bugs of the old QuantLinear copy -----------------------------------------
def test_old_layer_update_rule_unfused(monkeypatch):
    monkeypatch.setattr(tnn.QuantLinear, "update_scales",
                        _update_scales(update_of=lambda r: "unfused"))
    mismatches = diff.delayed_mismatches(FUSED, TRACE)
    assert mismatches and all("quantlinear" in m for m in mismatches)


def test_old_layer_mx_operand_finite_for_an_infinity(monkeypatch):
    def old_mx_blocks(t, fmt, axis, block_size=32, rule="ocp"):  # the removed copy
        moved = t.movedim(axis, -1)
        n = moved.shape[-1]
        b = torch.nn.functional.pad(moved, (0, (-n) % block_size))
        b = b.reshape(b.shape[0], -1, block_size)
        amax = b.abs().amax(dim=-1, keepdim=True)
        _, ex = torch.frexp(torch.where(amax > 0, amax, torch.ones_like(amax)))
        e = torch.where(amax > 0, ex - 1 - fmt.emax, torch.full_like(ex, -127)).clamp(-127, 127)
        q = round_elements(torch.ldexp(b, -e), fmt, saturate=True)
        return torch.ldexp(q, e).reshape(b.shape[0], -1)[:, :n].movedim(-1, axis)
    _wrap(monkeypatch, _operand_ops, "fake", lambda f: lambda t, q, **k: (
        old_mx_blocks(t, q.fmt, q.axis, q.size, q.rule) if type(q) is MXQuantizer
        else f(t, q, **k)))
    mismatches = diff.operand_mismatches("mx_e4m3_e5m2", "inf_block")
    assert mismatches and all("quantlinear" in m for m in mismatches)
