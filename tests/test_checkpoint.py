"""Checkpoint and resume: a resumed mixed-precision run is bit-identical to the uninterrupted one.

The oracle is the uninterrupted run itself: the same code, same seeds, never saved. Any
state that a checkpoint forgets (an Adam moment, the step count, the loss scaler's growth
tracker, a float32 master, the dropout generator) changes some later step's bits.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from normlab import checkpoint, nn
from normlab.nn.optim import SGD, AdamW
from normlab.precision import (
    DynamicLossScaler,
    LowPrecisionUpdater,
    MasterWeights,
    StaticLossScaler,
    mixed_precision_step,
    quantize,
)

STEPS, CUT = 10, 5
OVERFLOW_STEPS = (2, 6)  # one skipped step before the checkpoint, one after


@dataclass
class Run:
    model: nn.Module
    drop_rng: np.random.Generator
    master: MasterWeights
    opt: AdamW
    scaler: DynamicLossScaler


def build(seed: int) -> Run:
    """PyTorch's order: model, masters, optimizer, scaler."""
    rng = np.random.default_rng(seed)
    drop_rng = np.random.default_rng(seed + 1)
    model = nn.Sequential(
        nn.Linear(8, 16, rng=rng), nn.LayerNorm(16), nn.GELU(),
        nn.Dropout(0.25, drop_rng), nn.Linear(16, 4, rng=rng),
    )
    master = MasterWeights(model.parameters(), "bf16")
    opt = AdamW(master.masters, lr=1e-2, weight_decay=0.1)
    scaler = DynamicLossScaler(init_scale=2.0**10, growth_interval=3)
    return Run(model, drop_rng, master, opt, scaler)


def train_step(run: Run, t: int) -> tuple[float, bool, float]:
    data = np.random.default_rng(1000 + t)  # the data of step t, independent of the run
    x = data.standard_normal((6, 8)).astype(np.float32)  # N,D
    y = data.integers(0, 4, size=6)
    run.model.zero_grad()
    loss, dlogits = nn.softmax_cross_entropy(run.model(x), y)
    dscaled = run.scaler.scale_loss(dlogits)
    if t in OVERFLOW_STEPS:
        dscaled[0, 0] = np.inf  # as an fp16 backward that overflowed
    with np.errstate(invalid="ignore", over="ignore"):  # the intended overflow
        run.model.backward(dscaled)
    res = mixed_precision_step(run.master, run.opt, run.scaler, max_norm=1.0)
    return loss, res.skipped, res.scale


def fingerprint(run: Run) -> list[bytes]:
    """Every bit that must agree: working weights, masters, Adam state, scaler, rng."""
    out = [p.data.tobytes() for p in run.model.parameters()]
    out += [m.data.tobytes() for m in run.master.masters]
    for st in run.opt.state.values():
        out += [st["exp_avg"].tobytes(), st["exp_avg_sq"].tobytes(), bytes([st["step"]])]
    out.append(repr(sorted(run.scaler.state_dict().items())).encode())
    out.append(repr(run.drop_rng.bit_generator.state).encode())
    return out


def full_state(run: Run) -> dict[str, Any]:
    return {
        "model": run.model.state_dict(),
        "master": run.master.state_dict(),
        "optimizer": run.opt.state_dict(),
        "scaler": run.scaler.state_dict(),
        "rng": run.drop_rng.bit_generator.state,
    }


@pytest.fixture(scope="module")
def reference() -> list[tuple[tuple[float, bool, float], list[bytes]]]:
    run = build(0)
    trace = []
    for t in range(STEPS):
        trace.append((train_step(run, t), fingerprint(run)))
    assert [r[0][1] for r in trace] == [t in OVERFLOW_STEPS for t in range(STEPS)]
    scales = [r[0][2] for r in trace]  # grows at step CUT: the saved tracker matters
    assert scales == [1024.0, 1024.0, 512.0, 512.0, 512.0, 1024.0, 512.0, 512.0, 512.0, 1024.0]
    return trace


def _round_trip(state: dict[str, Any], how: str, tmp_path: Path) -> dict[str, Any]:
    if how == "npz":
        path = checkpoint.save(tmp_path / "ck", state)
        assert path == tmp_path / "ck.npz"
        return checkpoint.load(path)
    return pickle.loads(pickle.dumps(state))


@pytest.mark.parametrize("how", ["npz", "pickle"])
@pytest.mark.parametrize("order", ["torch", "master_first"])
def test_resume_is_bit_identical(reference: Any, how: str, order: str, tmp_path: Path) -> None:
    run = build(0)
    for t in range(CUT):
        assert (train_step(run, t), fingerprint(run)) == reference[t]
    state = _round_trip(full_state(run), how, tmp_path)
    del run
    resumed = build(123)  # different weights and generator: everything must come from state
    if order == "torch":
        resumed.model.load_state_dict(state["model"])
        resumed.master.load_state_dict(state["master"])
    else:  # masters first, then the module: the module's equal values keep the masters
        resumed.master.load_state_dict(state["master"])
        resumed.model.load_state_dict(state["model"])
    resumed.opt.load_state_dict(state["optimizer"])
    resumed.scaler.load_state_dict(state["scaler"])
    resumed.drop_rng.bit_generator.state = state["rng"]
    assert fingerprint(resumed) == reference[CUT - 1][1]
    for t in range(CUT, STEPS):
        assert (train_step(resumed, t), fingerprint(resumed)) == reference[t], f"step {t}"


def test_module_load_after_master_weights_is_seen_not_overwritten() -> None:
    run = build(0)
    for t in range(3):
        train_step(run, t)
    other = build(7).model.state_dict()  # values of a different model (not bf16-rounded)
    opt = SGD(run.master.masters, lr=0.0)  # a step that must not move anything
    run.model.load_state_dict(other)
    x = np.ones((2, 8), np.float32)
    run.model.zero_grad()
    run.model.backward(run.scaler.scale_loss(np.ones_like(run.model(x))))
    assert not mixed_precision_step(run.master, opt, run.scaler).skipped
    for (name, p), m in zip(run.model.named_parameters(), run.master.masters, strict=True):
        # masters follow the loaded values; the working copy is their bf16 rounding
        np.testing.assert_array_equal(m.data, other[name].astype(np.float32), strict=True)
        np.testing.assert_array_equal(p.data, quantize(other[name].astype(np.float32), "bf16"))


def test_master_weights_params_alias_is_deprecated() -> None:
    run = build(0)
    with pytest.warns(DeprecationWarning, match="masters"):
        alias = run.master.params
    assert alias is run.master.masters


def test_sync_force_after_in_place_write() -> None:
    run = build(0)
    p0 = run.model.parameters()[0]
    p0.data[...] = 0.5  # in place: not seen until sync(force=True)
    run.master.sync(force=True)
    assert np.all(run.master.masters[0].data == 0.5)


def test_flat_state_dicts_round_trip_through_plain_savez(tmp_path: Path) -> None:
    run = build(0)
    for t in range(4):
        train_step(run, t)
    static = StaticLossScaler(64.0)
    up = LowPrecisionUpdater("bf16", "kahan")
    up.apply(np.ones(3, np.float32), np.full(3, 2.0**-10))
    for obj in (run.model, run.master, run.scaler, static, up):
        buf = io.BytesIO()
        np.savez(buf, **obj.state_dict())  # NumPy < 2.1 has no allow_pickle here
        buf.seek(0)
        with np.load(buf, allow_pickle=False) as npz:
            loaded = {k: npz[k] for k in npz.files}  # 0-d arrays for the scalars
        before = obj.state_dict()
        obj.load_state_dict(loaded)
        after = obj.state_dict()
        assert sorted(after) == sorted(before)
        for key in before:
            np.testing.assert_array_equal(after[key], before[key])
            assert type(after[key]) is type(before[key]), key  # scalars back to Python


def test_kahan_compensation_resumes_bit_identically() -> None:
    def delta(t: int, k: int) -> np.ndarray:
        return np.random.default_rng(10 * t + k).standard_normal(5) * 2.0**-9

    ref_w = [np.ones(5, np.float32), np.full(5, 3.0, np.float32)]
    ref = LowPrecisionUpdater("bf16", "kahan")
    for t in range(6):
        for k, w in enumerate(ref_w):
            ref.apply(w, delta(t, k))
    assert np.any(ref.compensation(ref_w[0]) != 0)  # the buffers do carry information
    for bind in (False, True):
        ws = [np.ones(5, np.float32), np.full(5, 3.0, np.float32)]
        up = LowPrecisionUpdater("bf16", "kahan")
        for t in range(3):
            for k, w in enumerate(ws):
                up.apply(w, delta(t, k))
        state = checkpoint_round_trip(up.state_dict())
        ws = [w.copy() for w in ws]  # new arrays, as after a restart
        fresh = LowPrecisionUpdater("bf16", "kahan")
        fresh.load_state_dict(state, weights=ws if bind else None)
        for t in range(3, 6):
            for k, w in enumerate(ws):
                fresh.apply(w, delta(t, k))
        for w, r in zip(ws, ref_w, strict=True):
            np.testing.assert_array_equal(w, r, strict=True)


def checkpoint_round_trip(state: Any) -> Any:
    buf = io.BytesIO()
    checkpoint.save(buf, state)
    buf.seek(0)
    return checkpoint.load(buf)


def test_updater_state_checks() -> None:
    up = LowPrecisionUpdater("bf16", "kahan")
    w = np.ones(3, np.float32)
    up.apply(w, np.full(3, 2.0**-10))
    before = up.state_dict()
    with pytest.raises(ValueError, match="mode"):
        up.load_state_dict({**before, "mode": "nearest"})
    with pytest.raises(ValueError, match="format"):
        up.load_state_dict({**before, "format": "float16"})
    with pytest.raises(ValueError, match="weights"):
        up.load_state_dict(before, weights=[np.ones(4)])
    np.testing.assert_array_equal(up.state_dict()["compensation.0"], before["compensation.0"])
    fresh = LowPrecisionUpdater("bf16", "kahan")
    fresh.load_state_dict(before)
    with pytest.raises(ValueError, match="shape"):
        fresh.apply(np.ones(4, np.float32), np.zeros(4))  # buffer 0 has shape (3,)


def test_checkpoint_tree_types_survive() -> None:
    state = {
        "ints": {0: 1, 1: -(2**100)},  # int keys and a big int (PCG64 state is 128-bit)
        "tuple": (0.9, 0.999), "list": [1.5, None, True, "s"],
        "nan": float("nan"), "inf": float("-inf"),
        "f32": np.float32(1.25), "arr": np.arange(6, dtype=">f8").reshape(2, 3),
        "names": np.array(["a", "bc"]), "empty": {},
    }
    out = checkpoint_round_trip(state)
    assert out["ints"] == {0: 1, 1: -(2**100)} and out["tuple"] == (0.9, 0.999)
    assert out["list"] == [1.5, None, True, "s"] and out["empty"] == {}
    assert np.isnan(out["nan"]) and out["inf"] == float("-inf")
    assert type(out["f32"]) is np.float32 and out["f32"] == 1.25
    assert out["arr"].dtype == np.dtype(">f8")
    np.testing.assert_array_equal(out["arr"], state["arr"])
    assert out["names"].tolist() == ["a", "bc"]


def test_checkpoint_file_holds_only_the_tree_and_its_arrays(tmp_path: Path) -> None:
    # one member per array plus the tree: nothing else (NumPy < 2.1 would store a keyword
    # such as allow_pickle=False passed to savez as one more array), and no pickle inside
    path = checkpoint.save(tmp_path / "ck", {"w": np.ones(2), "opt": {"m": np.zeros(3)},
                                              "step": 7})
    with np.load(path, allow_pickle=False) as npz:
        assert len(npz.files) == 3
        assert all(npz[name].dtype != object for name in npz.files)


def test_checkpoint_rejects_what_needs_pickle(tmp_path: Path) -> None:
    with pytest.raises(TypeError, match=r"state/a/0"):
        checkpoint.save(io.BytesIO(), {"a": [object()]})
    with pytest.raises(TypeError, match="dtype object"):
        checkpoint.save(io.BytesIO(), {"a": np.array([None])})
    with pytest.raises(TypeError, match="keys must be str or int"):
        checkpoint.save(io.BytesIO(), {(1, 2): 0})
    with pytest.raises(TypeError):
        checkpoint.save(tmp_path / "x.npz", {"a": object()})
    assert list(tmp_path.iterdir()) == []  # no file and no temporary left behind
    np.savez(tmp_path / "plain.npz", a=np.ones(2))
    with pytest.raises(ValueError, match="not a normlab checkpoint"):
        checkpoint.load(tmp_path / "plain.npz")


def test_checkpoint_save_replaces_atomically(tmp_path: Path) -> None:
    target = tmp_path / "ck.npz"
    checkpoint.save(target, {"v": 1})
    checkpoint.save(target, {"v": 2})
    assert checkpoint.load(target) == {"v": 2}
    assert [p.name for p in tmp_path.iterdir()] == ["ck.npz"]


ROOT = Path(__file__).resolve().parents[1]


def test_production_doc_example_runs() -> None:
    text = (ROOT / "docs" / "production.md").read_text(encoding="utf-8")
    section = re.split(r"^## Checkpoint(?:ing)? and resume$", text, flags=re.M)[1]
    section = section.split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) == 1
    exec(compile(blocks[0], "docs/production.md", "exec"), {})  # ends in an assert


def test_checkpoint_resume_example_runs() -> None:
    path = os.pathsep.join(p for p in (str(ROOT / "src"), os.environ.get("PYTHONPATH")) if p)
    proc = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "checkpoint_resume.py")], cwd=ROOT,
        env={**os.environ, "PYTHONPATH": path}, capture_output=True, text=True, timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert proc.stdout.rstrip().endswith("bit for bit")


def test_import_normlab_reaches_the_checkpoint_module() -> None:
    # the documented spelling after a plain `import normlab`; a fresh interpreter, since
    # this file's own `from normlab import checkpoint` would set the attribute anyway
    code = "import normlab; print(normlab.checkpoint.save.__module__)"
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}
    proc = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "normlab.checkpoint"
