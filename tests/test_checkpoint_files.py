"""normlab.checkpoint on files it did not write: lazy, bounded, and a ValueError for each fault.

Forged files are built with `zipfile` and `np.lib.format` directly (the oracle of what a
member holds is the `.npy` format itself, not normlab's reader). The memory check uses
`tracemalloc`, which sees NumPy's and Python's allocations: a member that is never read
costs nothing, so the bound is a few MiB against a 512 MiB member.
"""

from __future__ import annotations

import io
import json
import os
import stat
import subprocess
import sys
import tracemalloc
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from normlab import checkpoint

TREE = "__normlab_checkpoint__.npy"


def _npy(arr: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.lib.format.write_array(buf, arr, allow_pickle=False)
    return buf.getvalue()


def _forged(root: Any, members: dict[str, bytes], *, compress: bool = False) -> io.BytesIO:
    text = root if isinstance(root, str) else json.dumps(root)  # a str: the root's JSON
    tree = f'{{"format": "normlab-checkpoint", "version": 1, "root": {text}}}'
    buf = io.BytesIO()
    how = zipfile.ZIP_DEFLATED if compress else zipfile.ZIP_STORED
    with zipfile.ZipFile(buf, "w", how) as z:
        z.writestr(TREE, _npy(np.array(tree)))
        for name, data in members.items():
            z.writestr(name + ".npy", data)
    buf.seek(0)
    return buf


def test_an_unreferenced_member_is_never_read(tmp_path):
    # 512 MiB of zeros deflate to about 0.5 MB: reading every member up front cost 512 MiB
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False,
                                                  "shape": (2**26,)})
    path = tmp_path / "bomb.npz"
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        z.writestr(TREE, _npy(np.array(json.dumps(
            {"format": "normlab-checkpoint", "version": 1,
             "root": {"t": "dict", "items": [["w", {"t": "array", "name": "state/w"}]]}}))))
        z.writestr("state/w.npy", _npy(np.arange(3.0)))
        with z.open("unused.npy", "w") as member:
            member.write(header.getvalue())
            zeros = bytes(2**24)
            for _ in range(32):
                member.write(zeros)
    assert path.stat().st_size < 2**21  # small on disk
    tracemalloc.start()
    try:
        got = checkpoint.load(path)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    np.testing.assert_array_equal(got["w"], np.arange(3.0))
    assert peak < 2**23  # 8 MiB: nothing near the 512 MiB member


def test_a_header_that_claims_more_than_the_member_holds_is_refused_before_reading():
    header = io.BytesIO()
    np.lib.format.write_array_header_1_0(header, {"descr": "<f8", "fortran_order": False,
                                                  "shape": (10**12,)})
    forged = _forged({"t": "array", "name": "big"}, {"big": header.getvalue() + bytes(16)})
    with pytest.raises(ValueError, match=r"member 'big\.npy'.*shape \(1000000000000,\)"):
        checkpoint.load(forged)


@pytest.mark.parametrize(
    ("root", "match"),
    [
        ({"t": "set", "items": []}, "unknown type 'set'"),
        ({"x": 1}, "unknown type None"),
        ([1, 2], "unknown type None"),
        ({"t": "array", "name": "missing"}, "'missing', which the file does not hold"),
        ({"t": "array", "name": 7}, "member 7"),
        ({"t": "array"}, "member None"),
        ({"t": "dict", "items": [["a", {"t": "array", "name": "a"}],
                                 ["b", {"t": "array", "name": "a"}]]}, "a second time"),
        ({"t": "dict", "items": 5}, "no list of items"),
        ({"t": "dict", "items": [[None, {"t": "value", "v": 1}]]}, "str or int key"),
        ({"t": "dict", "items": [["k"]]}, "str or int key"),
        ({"t": "dict", "items": [["k", {"t": "value", "v": 1}], ["k", {"t": "value", "v": 2}]]},
         "key 'k' twice"),
        ({"t": "value", "v": [1, 2]}, "holds a list, not a scalar"),
        ({"t": "scalar", "name": "a"}, r"scalar but its member has shape \(2,\)"),
        ({"t": "array", "name": "__normlab_checkpoint__"}, "does not hold"),
    ],
)
def test_a_forged_tree_is_a_value_error_naming_the_fault(root, match):
    forged = _forged(root, {"a": _npy(np.arange(2.0))})
    with pytest.raises(ValueError, match=match):
        checkpoint.load(forged)


def test_a_deeply_nested_tree_is_a_value_error():
    depth = 100_000  # deeper than any interpreter's recursion limit
    root = '{"t": "list", "items": [' * depth + '{"t": "value", "v": 1}' + "]}" * depth
    with pytest.raises(ValueError, match=r"nested too deeply|not the JSON object"):
        checkpoint.load(_forged(root, {}))


@pytest.mark.parametrize(
    ("data", "match"),
    [
        (b"not a npy file at all", "member 'a.npy'"),
        (_npy(np.arange(4.0))[:-8], "holds"),  # truncated data
        (_npy(np.zeros(2, dtype=[("f", "<f4")])), "dtype"),  # a structure
    ],
)
def test_a_malformed_member_is_a_value_error(data, match):
    with pytest.raises(ValueError, match=match):
        checkpoint.load(_forged({"t": "array", "name": "a"}, {"a": data}))


def test_npy_text_and_broken_zip_files_get_a_clear_message(tmp_path):
    npy = tmp_path / "w.npy"
    np.save(npy, np.arange(3))
    with pytest.raises(ValueError, match=r"is a \.npy file.*np\.load"):
        checkpoint.load(npy)
    text = tmp_path / "notes.txt"
    text.write_text("hello")
    with pytest.raises(ValueError, match=r"not a normlab checkpoint.*b'hello'"):
        checkpoint.load(text)
    broken = tmp_path / "broken.npz"
    broken.write_bytes(b"PK\x03\x04" + bytes(40))
    with pytest.raises(ValueError, match="not a valid normlab checkpoint"):
        checkpoint.load(broken)


def test_every_leaf_is_an_array_of_its_own_and_writable(tmp_path):
    a = np.arange(6.0).reshape(2, 3)
    path = checkpoint.save(tmp_path / "c", {"a": a, "b": a, "f": np.asfortranarray(a),
                                            "s": np.float32(2.5)})
    got = checkpoint.load(path)
    assert not np.shares_memory(got["a"], got["b"])
    got["a"][0, 0] = 99.0
    assert got["b"][0, 0] == 0.0
    assert got["f"].flags.f_contiguous and np.array_equal(got["f"], a)
    assert type(got["s"]) is np.float32 and got["s"] == np.float32(2.5)


def test_a_checkpoint_file_mode_follows_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        path = checkpoint.save(tmp_path / "c", {"w": np.zeros(2)})
    finally:
        os.umask(previous)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # 0o666 & ~0o027


_KILLED_WRITER = """
import os, sys
import numpy as np
from normlab import checkpoint
checkpoint._savez = lambda fh, **m: (fh.write(b"partial"), fh.flush(), os._exit(9))
checkpoint.save(sys.argv[1], {"w": np.zeros(4)})
"""


def test_the_temporary_file_of_a_killed_writer_is_removed_by_the_next_save(tmp_path):
    target = tmp_path / "c.npz"
    env = {**os.environ, "PYTHONPATH": str(Path(checkpoint.__file__).resolve().parents[1])}
    done = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(target)], env=env,
                          timeout=120, capture_output=True)
    assert done.returncode == 9, done.stderr
    left = [p.name for p in tmp_path.iterdir()]
    assert len(left) == 1 and left[0].endswith(".tmp")  # what a kill leaves behind
    other = tmp_path / ".other.npz.0a1b2c3d.tmp"  # another path's: not this save's business
    other.write_bytes(b"x")
    checkpoint.save(target, {"w": np.ones(2)})
    assert sorted(p.name for p in tmp_path.iterdir()) == [other.name, "c.npz"]
    np.testing.assert_array_equal(checkpoint.load(target)["w"], np.ones(2))
