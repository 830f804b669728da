"""normlab.torch.Fp8Meta state_dict / load_state_dict, and cross-loading with the NumPy twin.

Expected values come from the NumPy :class:`normlab.precision.Fp8Meta` driven with the same
inputs; comparisons are of float32 bit patterns (tolerance 0: the twins are bit-identical).
"""

from __future__ import annotations

import io

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from normlab.precision import DelayedScaling  # noqa: E402
from normlab.precision import Fp8Meta as NpMeta  # noqa: E402
from normlab.torch import Fp8Meta  # noqa: E402

RECIPE = DelayedScaling(amax_history_len=4, margin=1)


def _steps(meta, xs: list[np.ndarray], wrap) -> None:
    for x in xs:
        meta.quantize(wrap(x))
        meta.update()


def _xs(rng: np.random.Generator, n: int = 3) -> list[np.ndarray]:
    return [(rng.standard_normal(64) * 4.0**k).astype(np.float32) for k in range(n)]


def _bits(v) -> np.ndarray:
    a = v.cpu().numpy() if isinstance(v, torch.Tensor) else np.asarray(v, np.float32)
    return np.asarray(a, np.float32).view(np.uint32)


def _same(meta: Fp8Meta, np_meta: NpMeta) -> None:
    np.testing.assert_array_equal(_bits(meta.amax_history), _bits(np_meta.amax_history))
    assert _bits(meta.scale) == _bits(np_meta.scale)
    assert _bits(meta.scale_inv) == _bits(np_meta.scale_inv)


def test_state_dict_holds_tensor_copies_and_round_trips(rng) -> None:
    meta = Fp8Meta(RECIPE)
    _steps(meta, _xs(rng), torch.from_numpy)
    state = meta.state_dict()
    assert state["amax_history"].dtype == torch.float32 and state["scale"].shape == ()
    assert state["amax_history"].device == meta.amax_history.device
    state["amax_history"][1] = 99.0  # a copy: the meta is untouched
    assert float(meta.amax_history[1]) != 99.0
    buf = io.BytesIO()
    torch.save(meta.state_dict(), buf)
    buf.seek(0)
    other = Fp8Meta(RECIPE)
    other.load_state_dict(torch.load(buf))
    for a, b in ((other.amax_history, meta.amax_history), (other.scale, meta.scale),
                 (other.scale_inv, meta.scale_inv)):
        np.testing.assert_array_equal(_bits(a), _bits(b))
    x = torch.from_numpy(_xs(rng, 1)[0])
    np.testing.assert_array_equal(_bits(other.quantize(x).data), _bits(meta.quantize(x).data))


def test_torch_meta_loads_the_numpy_state_and_continues_identically(rng) -> None:
    np_meta = NpMeta(RECIPE)
    _steps(np_meta, _xs(rng), lambda x: x)
    buf = io.BytesIO()
    np.savez(buf, **np_meta.state_dict())  # 0-d arrays after np.load
    buf.seek(0)
    meta = Fp8Meta(RECIPE)
    meta.load_state_dict(dict(np.load(buf)))
    _same(meta, np_meta)
    nxt = _xs(rng, 2)
    _steps(meta, nxt, torch.from_numpy)
    _steps(np_meta, nxt, lambda x: x)
    _same(meta, np_meta)


def test_numpy_meta_loads_the_torch_state(rng) -> None:
    # the NumPy twin takes NumPy values: the torch state as .cpu().numpy() arrays
    meta = Fp8Meta(RECIPE)
    _steps(meta, _xs(rng), torch.from_numpy)
    state = {k: v.cpu().numpy() if isinstance(v, torch.Tensor) else v
             for k, v in meta.state_dict().items()}
    np_meta = NpMeta(RECIPE)
    np_meta.load_state_dict(state)
    _same(meta, np_meta)


@pytest.mark.parametrize("key, value, error", [
    ("role", "backward", ValueError),
    ("fp8_format", "E4M3", ValueError),
    ("amax_history_len", 5, ValueError),
    ("amax_history", torch.zeros(5), ValueError),
    ("scale", torch.tensor(float("nan")), ValueError),
    ("scale", -2.0, ValueError),
    ("scale", 1e39, ValueError),
    ("scale", "1.0", TypeError),
])
def test_bad_state_raises_and_changes_nothing(key: str, value, error, rng) -> None:
    meta = Fp8Meta(RECIPE)
    _steps(meta, _xs(rng, 2), torch.from_numpy)
    before = {k: v.clone() for k, v in meta.state_dict().items() if isinstance(v, torch.Tensor)}
    state = dict(meta.state_dict(), **{key: value})
    state["amax_history"] = torch.full((4,), 7.0) if key != "amax_history" else value
    with pytest.raises(error, match=key):
        meta.load_state_dict(state)
    for k, v in before.items():
        np.testing.assert_array_equal(_bits(getattr(meta, k)), _bits(v))
    with pytest.raises(ValueError, match="'scale'"):
        meta.load_state_dict({k: v for k, v in meta.state_dict().items() if k != "scale"})
