"""NumPy functions and their torch twins speak alike (issue 29): one set of argument names.

The rule checked: for every public name that both `normlab.precision` and `normlab.torch`
export as a function, the parameters are the same names in the same order, except
`out` (NumPy only: an output array) and `device` (torch only: where new tensors go).
Renamed arguments keep working under their old keyword, with a DeprecationWarning.
"""

from __future__ import annotations

import inspect
import warnings

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import normlab.precision as P  # noqa: E402
import normlab.torch as T  # noqa: E402

ONE_SIDED = {"out", "device"}


def _twins() -> list[str]:
    return sorted(n for n in set(P.__all__) & set(T.__all__)
                  if getattr(P, n) is not getattr(T, n) and inspect.isfunction(getattr(T, n)))


def test_the_twin_list_is_not_empty() -> None:
    # the check below must have something to compare (quantize, mx_quantize, ...)
    assert {"quantize", "mx_quantize", "nvfp4_quantize", "get_format"} <= set(_twins())


@pytest.mark.parametrize("name", _twins())
def test_twin_parameters_have_the_same_names(name: str) -> None:
    def names(fn: object) -> list[str]:
        return [p for p in inspect.signature(fn).parameters if p not in ONE_SIDED]  # type: ignore[arg-type]

    assert names(getattr(T, name)) == names(getattr(P, name))


def test_fp8_meta_is_one_class() -> None:
    meta = T.Fp8Meta(P.DelayedScaling(amax_history_len=2))
    assert isinstance(meta, P.Fp8Meta)
    with pytest.raises(TypeError, match="recipe must be a DelayedScaling"):
        T.Fp8Meta("fp8")  # type: ignore[arg-type]  # the base class's check


@pytest.mark.parametrize(("fn", "old", "kw"), [
    (T.quantize, "t", {"fmt": "bf16"}),
    (T.mx_quantize, "t", {}),
    (T.random_hadamard_transform, "t", {"seed": 3}),
    (T.inverse_random_hadamard_transform, "t", {"seed": 3}),
])
def test_old_keyword_warns_and_gives_the_same_result(fn, old, kw) -> None:  # type: ignore[no-untyped-def]
    x = torch.linspace(-3, 3, 64, dtype=torch.float32).reshape(2, 32)
    with pytest.warns(DeprecationWarning, match=f"{old}=...\\) is deprecated"):
        got = fn(**{old: x}, **kw)
    want = fn(x, **kw)
    if not isinstance(want, torch.Tensor):  # an MXTensor
        got, want = got.elements, want.elements
    assert torch.equal(got, want)


def test_old_and_new_keyword_together_is_an_error() -> None:
    with pytest.raises(TypeError, match="pass 'x' only"):
        T.quantize(x=torch.ones(2), t=torch.ones(2), fmt="bf16")


def test_get_format_takes_name_or_format_on_both_sides() -> None:
    assert T.get_format(name_or_format=torch.bfloat16) is P.get_format(name_or_format="bf16")
    with pytest.warns(DeprecationWarning):
        assert T.get_format(fmt="e4m3") is P.FLOAT8_E4M3FN


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_rng_gives_the_numpy_twins_bits(dtype: torch.dtype) -> None:
    x = np.random.default_rng(0).standard_normal((5, 33)).astype((dtype == torch.float64
                                                               and np.float64) or np.float32)
    want = P.quantize(x, "e4m3", rounding="stochastic", rng=np.random.default_rng(42))
    got = T.quantize(torch.from_numpy(x), "e4m3", rounding="stochastic",
                     rng=np.random.default_rng(42))
    np.testing.assert_array_equal(got.numpy().view(np.uint8), want.view(np.uint8))
    # and not by accident: another Generator state gives other bits
    other = T.quantize(torch.from_numpy(x), "e4m3", rounding="stochastic",
                       rng=np.random.default_rng(43))
    assert not np.array_equal(other.numpy(), want)


def test_rng_in_nvfp4_gives_the_numpy_twins_bits() -> None:
    x = np.random.default_rng(1).standard_normal((4, 32)).astype(np.float32)
    want = P.nvfp4_quantize(x, rounding="stochastic", rng=np.random.default_rng(7))
    got = T.nvfp4_quantize(torch.from_numpy(x), rounding="stochastic",
                           rng=np.random.default_rng(7))
    np.testing.assert_array_equal(got.elements.numpy(), want.elements)


def test_rng_rules_are_the_numpy_twins() -> None:
    x = torch.ones(3)
    rng = np.random.default_rng(5)
    before = rng.bit_generator.state
    T.quantize(x, "bf16", rng=rng)  # a deterministic mode accepts an rng, draws nothing
    assert rng.bit_generator.state == before
    with pytest.raises(ValueError, match="exactly one source"):
        T.quantize(x, "bf16", rounding="stochastic", rng=rng, seed=1)
    with pytest.raises(TypeError):
        T.quantize(x, "bf16", rounding="stochastic", rng=5)


def test_updater_and_adamw_name_the_rounding_alike() -> None:
    up = P.LowPrecisionUpdater("bf16", param_rounding="kahan")
    assert up.param_rounding == "kahan" == up.mode
    assert "param_rounding" in inspect.signature(T.AdamW).parameters
    with pytest.warns(DeprecationWarning, match="mode=...\\) is deprecated"):
        old = P.LowPrecisionUpdater("bf16", mode="kahan")
    assert old.param_rounding == "kahan"


def test_updater_loads_a_state_saved_under_the_old_key() -> None:
    up = P.LowPrecisionUpdater("bf16", "kahan")
    w = np.ones(4, np.float32)
    up.apply(w, np.full(4, 2.0**-10, np.float32))
    state = up.state_dict()
    assert state["param_rounding"] == "kahan"
    old = {("mode" if k == "param_rounding" else k): v for k, v in state.items()}
    fresh = P.LowPrecisionUpdater("bf16", "kahan")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fresh.load_state_dict(old, weights=[w])
    np.testing.assert_array_equal(fresh.compensation(w), up.compensation(w))
    with pytest.raises(ValueError, match="must be 'nearest'"):
        P.LowPrecisionUpdater("bf16").load_state_dict(old)
