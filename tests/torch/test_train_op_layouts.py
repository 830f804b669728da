"""The operand ops' fake implementations describe their real outputs: shape, dtype, strides.

`torch.compile` plans every later op from the fake implementation, so a fake that says
columns first while the kernel wrote rows first gives the GEMM other strides than eager
ran with (or wrong memory reads in inductor's code). The layout rule (`order_of`) is: as
the input lies, the random Hadamard transform's output rows first, and 1-D MX and NVFP4
blocks along axis 0 columns first off the CPU only. Checked here on the CPU, on both paths
(numba kernels and the torch fallback), for every recipe, role, axis, input dtype and
layout, and with NVFP4's transform. Exact comparison: metadata, no tolerance.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from torch._subclasses.fake_tensor import FakeTensorMode  # noqa: E402

from normlab import _backend  # noqa: E402
from normlab.precision.scaled.hadamard import rht_matrix  # noqa: E402
from normlab.precision.scaled.quantizers import Quantizer  # noqa: E402
from normlab.torch.recipes import (  # noqa: E402
    Fp8CurrentRecipe,
    MXRecipe,
    NVFP4Recipe,
)
from normlab.torch.training import _operand_ops as ops  # noqa: E402
from recipe_table import TRAINING, operand_recipes  # noqa: E402

RECIPES = operand_recipes(TRAINING)
CASES = [(name, role, axis) for name in RECIPES for role in ("x", "w", "dy")
         for axis in (0, 1)]
PATHS = ["kernels", "torch"]


def _input(layout: str, dtype: torch.dtype) -> torch.Tensor:
    t = torch.randn(48, 40, generator=torch.Generator().manual_seed(0)).to(dtype)
    return t if layout == "C" else t.t().contiguous().t()


def _meta(t: torch.Tensor) -> tuple[object, ...]:
    return tuple(t.shape), t.dtype, t.stride()


def _path(monkeypatch: pytest.MonkeyPatch, path: str) -> None:
    if path == "torch":
        monkeypatch.setattr(ops, "_fast", lambda name: False)
    elif _backend.kernel("fake_operand") is None:
        pytest.fail("the numba operand kernels are a test dependency (numba installed)")


def _real_and_fake(fn, t: torch.Tensor, spec: Quantizer,
                   **kwargs: object) -> tuple[object, object]:
    """`fn(t, spec, **kwargs)` run for real and under fake tensors (as tracing runs it)."""
    real = fn(t, spec, **kwargs)
    with FakeTensorMode() as mode:
        fake = fn(mode.from_tensor(t), spec, **{
            k: mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
            for k, v in kwargs.items()})
    return real, fake


def _flat(out: object) -> list[torch.Tensor]:
    """The tensors of an op wrapper's result ((values, parts) nests one level)."""
    if isinstance(out, torch.Tensor):
        return [out]
    return [t for item in out for t in _flat(item)]  # type: ignore[attr-defined]


def _scale(spec: Quantizer) -> torch.Tensor | None:
    return torch.tensor(0.5) if spec.takes_scale else None


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("name,role,axis", CASES)
def test_fake_and_encode_ops_describe_their_outputs(monkeypatch, path, dtype, layout, name,
                                                      role, axis):
    _path(monkeypatch, path)
    spec = RECIPES[name].quantizer(role, axis)
    t = _input(layout, dtype)
    for fn in (ops.fake, ops.encode):
        real, fake = _real_and_fake(fn, t, spec, scale=_scale(spec))
        assert [_meta(p) for p in _flat(fake)] == [_meta(p) for p in _flat(real)]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", ["C", "F"])
@pytest.mark.parametrize("rows", [48, 40])  # 40: padded to 48 by the transform
def test_hadamard_operands_are_rows_first_as_their_fakes_say(monkeypatch, path, layout, rows):
    _path(monkeypatch, path)
    spec = NVFP4Recipe().quantizer("dy", 0)
    t = _input(layout, torch.float32)[:rows]
    h = torch.as_tensor(rht_matrix(16, 7), dtype=torch.float32)
    real, fake = _real_and_fake(ops.fake, t, spec, step=torch.tensor(3), stream=1, which=1,
                                hadamard=h)
    assert _meta(fake) == _meta(real)
    assert real.stride() == (40, 1)  # rows first on the CPU, whatever x's layout
    real_parts, fake_parts = _real_and_fake(ops.encode, t, spec, hadamard=h)
    assert [_meta(p) for p in fake_parts] == [_meta(p) for p in real_parts]


@pytest.mark.parametrize("name", ["bf16", "current"])
@pytest.mark.parametrize("layout", ["C", "F"])
def test_one_pass_op_describes_its_outputs(name, layout):
    spec = RECIPES[name].quantizer("x", 0)
    t = _input(layout, torch.bfloat16)
    real, fake = _real_and_fake(ops.fake_encode, t, spec, scale=_scale(spec))
    assert [_meta(p) for p in _flat(fake)] == [_meta(p) for p in _flat(real)]


@pytest.mark.parametrize("device,expected", [("cpu", "C"), ("meta", "F")])
def test_axis0_blocks_are_columns_first_off_the_cpu_only(device, expected):
    spec = MXRecipe().quantizer("dy", 0)
    assert ops.order_of(spec, True, torch.device(device)) == expected
    assert ops.order_of(spec, False, torch.device(device)) == "F"
    # per-tensor and tiled kinds follow the input everywhere
    tensor = Fp8CurrentRecipe().quantizer("dy", 0)
    assert ops.order_of(tensor, True, torch.device(device)) == "C"
