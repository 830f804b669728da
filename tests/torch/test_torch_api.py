"""normlab.torch.quantize's contract beyond bit patterns: seeds, dtypes, shapes, errors,
torch-dtype formats, the import guard, and the straight-through estimator."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import normlab.torch as nt
from normlab import precision
from normlab.precision import FLOAT4_E2M1FN, FLOAT8_E4M3FN, FLOAT8_E8M0FNU, get_format


def _bits(t: torch.Tensor) -> np.ndarray:
    a = t.detach().numpy()
    return a.view(np.uint32 if a.dtype == np.float32 else np.uint64)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("seed", [0, 12345, 2**64 - 3])  # the last wraps within the tensor
def test_seed_matches_numpy(dtype, seed, rng):
    x = (rng.standard_normal((37, 29)) * 8).astype(dtype)
    want = precision.quantize(x, "e4m3", rounding="stochastic", seed=seed)
    got = nt.quantize(torch.from_numpy(x), "e4m3", rounding="stochastic", seed=seed)
    np.testing.assert_array_equal(_bits(got), want.view(_bits(got).dtype))
    again = nt.quantize(torch.from_numpy(x), "e4m3", rounding="stochastic",
                        seed=np.uint64(seed))  # numpy ints are seeds too, as on NumPy's side
    assert torch.equal(got, again)


def test_words_match_numpy_and_differ_by_seed():
    want = precision.stochastic_words(2**64 - 2, (3, 5)).view(np.int64)
    got = nt.stochastic_words(2**64 - 2, (3, 5))
    np.testing.assert_array_equal(got.numpy(), want)
    assert not torch.equal(nt.stochastic_words(1, (64,)), nt.stochastic_words(2, (64,)))
    # the published first SplitMix64 output of state 0 (Steele et al. 2014)
    assert int(nt.splitmix64(torch.zeros(1, dtype=torch.int64))) % 2**64 == 0xE220A8397B1DCDAF


def test_stochastic_is_unbiased_in_expectation():
    # 1 + 2^-5 lies 1/4 of the way from 1 to 1.125 (E4M3 spacing 2^-3): P(up) = 1/4
    n = 2**14
    q = nt.quantize(torch.full((n,), 1.0 + 2**-5), "e4m3", rounding="stochastic", seed=9)
    p_up = float((q == 1.125).float().mean())
    assert abs(p_up - 0.25) < 4 * (0.25 * 0.75 / n) ** 0.5  # 4 binomial standard deviations


def test_uint64_words_equal_int64_words(rng):
    x = torch.from_numpy(rng.standard_normal(100).astype(np.float32))
    w = nt.stochastic_words(5, (100,))
    a = nt.quantize(x, "bf16", rounding="stochastic", random_bits=w)
    b = nt.quantize(x, "bf16", rounding="stochastic", random_bits=w.view(torch.uint64))
    c = nt.quantize(x, "bf16", rounding="stochastic", seed=5)
    assert torch.equal(a, b) and torch.equal(a, c)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("mode", ["nearest", "toward_zero", "stochastic"])
def test_half_inputs_round_in_float32(dtype, mode, rng):
    # every bf16/fp16 value is a float32: the widened input is exact, the result is an
    # E4M3 value, which both 16-bit types hold, so the cast back is exact too
    x = torch.from_numpy((rng.standard_normal(500) * 30).astype(np.float32)).to(dtype)
    kw = {"seed": 3} if mode == "stochastic" else {}
    got = nt.quantize(x, "e4m3", rounding=mode, **kw)
    assert got.dtype == dtype and got.shape == x.shape
    want = precision.quantize(x.float().numpy(), "e4m3", rounding=mode, **kw)
    np.testing.assert_array_equal(got.float().numpy().view(np.uint32), want.view(np.uint32))


def test_shapes_strides_and_grad_inputs(rng):
    x = torch.from_numpy(rng.standard_normal((6, 7)).astype(np.float32))
    xt = x.t()  # non-contiguous (7, 6)
    assert torch.equal(nt.quantize(xt, "e5m2"), nt.quantize(xt.contiguous(), "e5m2"))
    assert nt.quantize(torch.tensor(3.3), "e2m1").item() == 3.0  # 0-d; 3.3 -> 3
    assert nt.quantize(torch.empty(0, 4), "e4m3").shape == (0, 4)
    xg = x.clone().requires_grad_()
    out = nt.quantize(xg, "bf16")
    assert not out.requires_grad and torch.equal(out, nt.quantize(x, "bf16"))


@pytest.mark.parametrize(
    ("kwargs", "exc", "words"),
    [
        ({"t": np.ones(3, np.float32)}, TypeError, "torch.Tensor"),
        ({"t": torch.ones(3, dtype=torch.int32)}, TypeError, "int32"),
        ({"fmt": "e9m99"}, ValueError, "at most 32"),
        ({"fmt": torch.int8}, ValueError, "not a float dtype"),
        ({"rounding": "up"}, ValueError, "rounding must be one of"),
        ({"saturate": 1}, TypeError, "saturate must be a bool"),
        ({"rounding": "stochastic"}, ValueError, "exactly one source"),
        ({"seed": 1, "random_bits": torch.zeros(3, dtype=torch.int64)}, ValueError,
         "exactly one source"),
        ({"rounding": "stochastic", "seed": -1}, ValueError, "[0, 2**64)"),
        ({"rounding": "stochastic", "seed": True}, TypeError, "seed must be an int"),
        ({"rounding": "stochastic", "seed": 2.0}, TypeError, "seed must be an int"),
        ({"rounding": "stochastic", "random_bits": torch.zeros(4, dtype=torch.int64)},
         ValueError, "shape"),
        ({"rounding": "stochastic", "random_bits": torch.zeros(3)}, TypeError, "int64"),
    ],
)
def test_errors_name_the_argument(kwargs, exc, words):
    args = {"t": torch.ones(3), "fmt": "e4m3", **kwargs}
    with pytest.raises(exc) as info:
        nt.quantize(args.pop("t"), args.pop("fmt"), **args)
    assert words in str(info.value)


@pytest.mark.parametrize(
    ("dtype", "name"),
    [("bfloat16", "bfloat16"), ("float16", "float16"), ("float32", "float32"),
     ("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2"),
     ("float8_e4m3fnuz", "float8_e4m3fnuz"), ("float8_e5m2fnuz", "float8_e5m2fnuz"),
     ("float8_e8m0fnu", "float8_e8m0fnu"), ("float4_e2m1fn_x2", "float4_e2m1fn")],
)
def test_get_format_of_torch_dtypes(dtype, name):
    fmt = nt.get_format(getattr(torch, dtype))
    assert fmt == get_format(name) and get_format(getattr(torch, dtype)) == fmt
    if dtype.startswith("float8") and dtype != "float8_e8m0fnu":  # torch's own finfo agrees
        assert fmt.max == torch.finfo(getattr(torch, dtype)).max
    assert nt.get_format(torch.float8_e4m3fn) is FLOAT8_E4M3FN
    assert nt.get_format(torch.float8_e8m0fnu) is FLOAT8_E8M0FNU
    assert nt.get_format(torch.float4_e2m1fn_x2) is FLOAT4_E2M1FN


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120, check=False)


def test_core_never_imports_torch_and_guard_names_the_extra():
    core = _run("import sys, normlab, normlab.precision as p; p.get_format('bf16'); "
                "p.quantize([1.0], 'e4m3'); print('torch' in sys.modules)")
    assert core.returncode == 0 and core.stdout.strip() == "False", core.stderr
    guard = _run("import sys; sys.modules['torch'] = None; import normlab.torch")
    assert guard.returncode != 0 and 'pip install ".[torch]"' in guard.stderr


def test_an_older_torch_than_the_extra_allows_is_refused_with_its_version():
    # the torch extra's lower bound is the oldest release the suite passes with; an older
    # one (here: this torch relabelled 2.10.0) is refused at import, naming what was found
    old = _run("import torch; torch.__version__ = '2.10.0+cpu'; import normlab.torch")
    assert old.returncode != 0 and "PyTorch >= 2.13" in old.stderr
    assert "found torch 2.10.0+cpu" in old.stderr
    same = _run("import torch; torch.__version__ = '2.13.0'; import normlab.torch; print('ok')")
    assert same.returncode == 0 and same.stdout.strip() == "ok", same.stderr
    text = (Path(__file__).resolve().parents[2] / "pyproject.toml").read_text(encoding="utf-8")
    assert 'torch = ["torch>=2.13"]' in text  # the import check and the extra agree


def test_ste_forward_equals_quantize_and_gradient_is_identity(rng):
    for dtype in (torch.float32, torch.bfloat16):
        x = torch.from_numpy(rng.standard_normal(64).astype(np.float32)).to(dtype)
        x.requires_grad_()
        y = nt.quantize_ste(x, "e2m1", rounding="stochastic", seed=4)
        assert torch.equal(y.detach(), nt.quantize(x, "e2m1", rounding="stochastic", seed=4))
        g = torch.from_numpy(rng.standard_normal(64).astype(np.float32)).to(dtype)
        y.backward(g)
        assert x.grad is not None and x.grad.dtype == dtype and torch.equal(x.grad, g)


# torch's own tracer instantiates every autograd.Function and warns about it (torch 2.13)
@pytest.mark.filterwarnings("ignore:.*should not be instantiated:DeprecationWarning")
def test_ste_traces_without_graph_breaks():
    import torch._dynamo as dynamo

    def f(x: torch.Tensor) -> torch.Tensor:
        return nt.quantize_ste(x, "e4m3", saturate=True) + nt.quantize_ste(
            x, "bf16", rounding="stochastic", seed=1)

    explained = dynamo.explain(f)(torch.randn(16))
    assert explained.graph_break_count == 0 and explained.graph_count == 1
