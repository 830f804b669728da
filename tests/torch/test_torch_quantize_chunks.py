"""The CPU chunk loop of normlab.torch.quantize (nearest into bf16, fp16, E4M3FN, E5M2).

Oracle: ``normlab.precision.quantize`` on the same float32 data (for bfloat16/float16
inputs: on the exactly widened data, then torch's round-to-nearest-even cast back, which
is how ``normlab.torch.quantize`` defines those). Every comparison is on the bits
(tolerance 0: rounding is exact), over every float32 with a bf16 prefix, every midpoint
of the format and the floats either side, and the specials, placed across chunk
boundaries by small chunk sizes.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import normlab.torch as nt  # noqa: E402
from normlab.precision import decode, get_format, quantize  # noqa: E402
from normlab.torch import _cpuround  # noqa: E402
from normlab.torch._fastround import round_elements  # noqa: E402
from normlab.torch.quantize import _nearest_by_cast  # noqa: E402

FORMATS = ["bf16", "fp16", "e4m3", "e5m2"]
SPECIALS = np.array([0x7FC00000, 0xFFC00000, 0x7F800001, 0xFFA00001, 0x7F800000, 0xFF800000,
                     0x7F7FFFFF, 0x00000001, 0x80000001, 0x00000000, 0x80000000],
                    np.uint32).view(np.float32)


_PROBE = _cpuround._threads_waiting


@pytest.fixture(autouse=True)
def _chunked(monkeypatch):
    """The chunk loop whatever the machine's load (the probe only picks the chunk size)."""
    monkeypatch.setattr(_cpuround, "_threads_waiting", lambda: False)


def _patterns(fmt_name: str, rng: np.random.Generator) -> np.ndarray:
    """bf16-prefix floats (low half 0 / tie / below / above), every midpoint of ``fmt``
    and its float32 neighbours, random values, and NaNs with payloads, infinities, the
    largest float, subnormals and signed zeros repeated every 997 elements."""
    top = np.arange(2**16, dtype=np.uint32) << np.uint32(16)
    parts = [(top | low).view(np.float32) for low in (0, 0x8000, 0x7FFF, 0x8001)]
    values = np.unique(decode(np.arange(2 ** get_format(fmt_name).bits, dtype=np.uint64),
                              get_format(fmt_name)).astype(np.float64))
    values = values[np.isfinite(values)]
    mids = ((values[1:] + values[:-1]) / 2).astype(np.float32)  # exact in float32
    parts += [mids, np.nextafter(mids, np.float32(np.inf)), np.nextafter(mids, -np.inf),
              rng.standard_normal(4096).astype(np.float32) * 10.0]
    x = rng.permutation(np.concatenate(parts))
    x[::997] = np.resize(SPECIALS, x[::997].size)
    return x


def _want(x: np.ndarray, fmt: str, saturate: bool) -> np.ndarray:
    with np.errstate(over="ignore", invalid="ignore"):
        return quantize(x, fmt, saturate=saturate).view(np.uint32)


def _bits(t: torch.Tensor) -> np.ndarray:
    return t.contiguous().numpy().view(np.uint32)


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("chunk", [1, 997, 4096, None, "whole"])
def test_float32_chunks_bit_identical(fmt, saturate, chunk, rng, monkeypatch):
    x = _patterns(fmt, rng)  # ~270K elements
    x = np.tile(x, -(-_cpuround._CHUNK * 5 // 4 // x.size))  # more than one default chunk
    assert x.size > _cpuround._CHUNK
    # "whole": as on a busy machine, one chunk; None: the default chunk size
    monkeypatch.setattr(_cpuround, "_threads_waiting", lambda: chunk == "whole")
    if isinstance(chunk, int):
        monkeypatch.setattr(_cpuround, "_CHUNK", chunk)
        monkeypatch.setattr(_cpuround, "_MIN_CASTS", 1)
        x = x[:20011]  # a chunk of 1 is slow: a prefix, still every special
    want = _want(x, fmt, saturate)
    got = nt.quantize(torch.from_numpy(x), fmt, saturate=saturate)
    np.testing.assert_array_equal(_bits(got), want)
    fast = round_elements(torch.from_numpy(x), get_format(fmt), saturate=saturate)
    np.testing.assert_array_equal(_bits(fast), want)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("fmt", FORMATS)
def test_half_inputs_chunked(fmt, dtype, rng, monkeypatch):
    monkeypatch.setattr(_cpuround, "_CHUNK", 4093)
    monkeypatch.setattr(_cpuround, "_MIN_CASTS", 1)
    x16 = torch.from_numpy(_patterns(fmt, rng)[:50000]).to(dtype)
    wide = x16.float().numpy()
    for saturate in (False, True):
        want = torch.from_numpy(_want(wide, fmt, saturate).view(np.float32)).to(dtype)
        got = nt.quantize(x16, fmt, saturate=saturate)
        assert got.dtype == dtype
        np.testing.assert_array_equal(got.view(torch.int16).numpy(),
                                      want.view(torch.int16).numpy())


@pytest.mark.parametrize("fmt", FORMATS)
def test_layouts_and_sizes(fmt, rng, monkeypatch):
    monkeypatch.setattr(_cpuround, "_CHUNK", 1000)
    monkeypatch.setattr(_cpuround, "_MIN_CASTS", 1)
    x = torch.from_numpy(_patterns(fmt, rng)[:60000].reshape(200, 300))
    for view in (x.t(), x[::3, 1::2], x.reshape(2, 100, 300).permute(2, 0, 1)):
        got = nt.quantize(view, fmt)
        assert got.shape == view.shape
        np.testing.assert_array_equal(_bits(got), _want(view.contiguous().numpy(), fmt, False))
    f = get_format(fmt)
    for rnd in (nt.quantize, lambda t, f: _cpuround.nearest_chunks(t, f, False)):
        # quantize takes the whole-tensor casts for 0 or 1 element; the chunks directly
        zero_d = torch.tensor(float("nan")).neg()
        assert _bits(rnd(zero_d, f)).item() == 0xFFC00000  # quiet NaN, sign kept
        assert rnd(torch.tensor(-0.0), f).view(torch.int32).item() == -(2**31)
        for shape in [(0,), (3, 0, 2)]:
            assert rnd(torch.empty(shape), f).shape == shape


def test_independent_of_thread_count(rng, monkeypatch):
    monkeypatch.setattr(_cpuround, "_MIN_CASTS", 1)
    x = torch.from_numpy(_patterns("e4m3", rng))
    before = torch.get_num_threads()
    try:
        results = []
        for threads in (1, 2, 3):
            torch.set_num_threads(threads)
            results.append([_bits(nt.quantize(x, f)) for f in FORMATS])
    finally:
        torch.set_num_threads(before)
    for other in results[1:]:
        for a, b in zip(results[0], other, strict=True):
            np.testing.assert_array_equal(a, b)


def test_large_output_is_an_ordinary_tensor():
    x = torch.linspace(-500.0, 500.0, 1 << 21)  # 8 MiB: the output asks for huge pages
    q = nt.quantize(x, "e4m3")
    assert q.is_contiguous() and not q.requires_grad
    np.testing.assert_array_equal(_bits(q.clone()), _want(x.numpy(), "e4m3", False))
    q.resize_(1 << 22)  # resizable storage, as any torch.empty (.numpy() would pin it)
    assert q.numel() == 1 << 22
    assert q.requires_grad_().sum().grad_fn is not None


@pytest.mark.parametrize("saturate", [False, True])
@pytest.mark.parametrize("fmt", FORMATS)
def test_whole_tensor_paths_stay_exact(fmt, saturate, rng):
    # the casts CUDA (and torch.compile, and grad-tracking round_elements inputs) still
    # take, checked here on the CPU on the same patterns
    x = _patterns(fmt, rng)
    want = _want(x, fmt, saturate)
    got = _nearest_by_cast(torch.from_numpy(x), get_format(fmt), saturate)
    np.testing.assert_array_equal(_bits(got), want)
    tracked = torch.from_numpy(x).requires_grad_()
    fast = round_elements(tracked, get_format(fmt), saturate=saturate)
    np.testing.assert_array_equal(_bits(fast.detach()), want)


def test_probe_reads_the_clock(monkeypatch):
    # a thread pool slower than the limit is detected; with one thread there is no pool
    ticks = iter([0.0, 1.0])
    monkeypatch.setattr(_cpuround.time, "perf_counter", lambda: next(ticks))
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(2)
        assert _PROBE()
        torch.set_num_threads(1)
        assert not _PROBE()
    finally:
        torch.set_num_threads(before)


def test_route_by_size_and_device():
    e4m3, bf16 = get_format("e4m3"), get_format("bf16")
    assert not _cpuround.use_chunks(torch.zeros(_cpuround._MIN_E4M3 - 1), e4m3)
    assert _cpuround.use_chunks(torch.zeros(_cpuround._MIN_E4M3), e4m3)
    assert not _cpuround.use_chunks(torch.zeros(_cpuround._MIN_CASTS - 1), bf16)
    assert _cpuround.use_chunks(torch.zeros(_cpuround._MIN_CASTS), bf16)
    assert not _cpuround.use_chunks(torch.zeros(1 << 20), get_format("e3m4"))
    assert not _cpuround.use_chunks(torch.zeros(1 << 20, device="meta"), e4m3)
    tracked = torch.zeros(1 << 20, requires_grad=True)
    assert not _cpuround.use_chunks(tracked, e4m3)
    with torch.no_grad():
        assert _cpuround.use_chunks(tracked, e4m3)


def test_unknown_format_raises():
    with pytest.raises(KeyError, match="e3m4"):
        _cpuround.nearest_chunks(torch.zeros(3), get_format("e3m4"), False)
