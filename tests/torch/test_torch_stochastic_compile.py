"""torch.compile of the rounding paths: one graph, no recompiles per seed, eager's bits.

Graph breaks are counted with ``torch._dynamo.explain`` (they must be 0: the forward has no
Python branch on tensor values and no NumPy scalars). Compiled results are compared with
eager on the bits (tolerance 0: the same integer and float32 operations, each exact).
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
dynamo = pytest.importorskip("torch._dynamo")
testing = pytest.importorskip("torch._dynamo.testing")

from normlab.precision import RoundingMode  # noqa: E402
from normlab.precision import splitmix64 as np_splitmix64  # noqa: E402
from normlab.torch import nvfp4_quantize, quantize_ste  # noqa: E402
from normlab.torch._stochastic import splitmix64_int  # noqa: E402
from normlab.torch.training._gemm import stream_seed  # noqa: E402

# Dynamo instantiates the autograd.Function internally while tracing (a torch-side warning)
pytestmark = pytest.mark.filterwarnings(
    "ignore:.*should not be instantiated:DeprecationWarning")

FORMATS = ("e2m1", "e4m3", "e5m2", "bf16", "e8m0")  # e8m0: the general bit path
SEEDS = (1, 2, 3, 2**63 + 7, 2**64 - 1, 5)


def _x() -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    x = torch.randn(48, 40, generator=g) * 2.0 ** torch.randint(-20, 12, (48, 40), generator=g)
    x[0, :5] = torch.tensor([float("inf"), -float("inf"), float("nan"), -0.0, 1e-40])
    return x


@pytest.mark.parametrize("mode", [m.value for m in RoundingMode])
@pytest.mark.parametrize("fmt", FORMATS)
def test_quantize_ste_traces_as_one_graph(mode, fmt):
    kw = {"seed": 5} if mode == "stochastic" else {}
    x = _x().requires_grad_()
    for saturate in (False, True):
        dynamo.reset()
        ex = dynamo.explain(lambda t, s=saturate: quantize_ste(
            t, fmt, rounding=mode, saturate=s, **kw))(x)
        assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons


@pytest.mark.parametrize("block_shape", [None, (16, 16)])
@pytest.mark.parametrize("rounding", ["nearest", "stochastic"])
def test_nvfp4_traces_as_one_graph(rounding, block_shape):
    kw = {"seed": 3} if rounding == "stochastic" else {}
    dynamo.reset()
    ex = dynamo.explain(lambda t: nvfp4_quantize(
        t, rounding=rounding, block_shape=block_shape, **kw).dequantize())(_x())
    assert (ex.graph_count, ex.graph_break_count) == (1, 0), ex.break_reasons


def _compiled_equals_eager(fn, backend, seeds) -> int:
    """Compile ``fn(x, seed)``; assert its bits equal eager's for every seed; return the
    number of frames compiled."""
    dynamo.reset()
    breaks = dynamo.utils.counters["graph_break"]
    breaks.clear()
    counter = testing.CompileCounterWithBackend(backend)
    compiled = torch.compile(fn, backend=counter)
    x = _x()
    for seed in seeds:
        want, got = fn(x, seed), compiled(x, seed)
        assert torch.equal(got.view(torch.int32), want.view(torch.int32)), seed
    assert not breaks, dict(breaks)  # no break, no silent fallback to eager
    return counter.frame_count


@pytest.mark.parametrize("fmt", FORMATS)
def test_aot_eager_matches_eager_bitwise_without_recompiling_per_seed(fmt):
    frames = _compiled_equals_eager(
        lambda t, s: quantize_ste(t, fmt, rounding="stochastic", saturate=True, seed=s),
        "aot_eager", SEEDS)
    assert frames <= 2  # the first seed is specialised, then the seed becomes symbolic


def test_nvfp4_aot_eager_matches_eager_bitwise():
    frames = _compiled_equals_eager(
        lambda t, s: nvfp4_quantize(t, rounding="stochastic", seed=s).dequantize(),
        "aot_eager", SEEDS)
    assert frames <= 2


@pytest.mark.filterwarnings("ignore:.*script_method. is deprecated:DeprecationWarning")
@pytest.mark.parametrize("fmt", ["e2m1", "bf16"])
def test_inductor_matches_eager_bitwise(fmt):
    # inductor's generated code holds symbolic ints as int64: seeds below 2^63 (as the
    # recipes' stream seeds are); the second seed makes the seed symbolic
    frames = _compiled_equals_eager(
        lambda t, s: quantize_ste(t, fmt, rounding="stochastic", seed=s), "inductor",
        (1, 2, 2**63 - 1, 3))
    assert frames <= 2


def test_scalar_splitmix64_and_stream_seed():
    states = [0, 1, 2**32, 2**63 - 1, 2**63, 2**64 - 1]
    want = np_splitmix64(np.array(states, np.uint64)).tolist()
    assert [splitmix64_int(s) for s in states] == want
    assert 0 <= stream_seed(7, 3, 1) < 2**63
    assert stream_seed(7, 3, 1) != stream_seed(7, 3, 0)
