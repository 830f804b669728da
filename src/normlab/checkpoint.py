"""Save and load nested state dicts as one `.npz` file, without pickle.

Contract: [save][normlab.checkpoint.save] accepts any tree of dicts (str or int keys), lists and
tuples whose leaves are NumPy arrays (numeric, bool or str dtypes), NumPy scalars and Python
scalars (int, float, bool, str, None), e.g. `{"model": model.state_dict(), "optimizer":
opt.state_dict(), "rng": rng.bit_generator.state}`. Arrays are stored as the `.npz` members
(readable with `np.load`, named after their path in the tree); the tree itself, with the Python
scalars, is stored as one JSON string member. [load][normlab.checkpoint.load] gives back the
same tree: dicts with their key types, lists, tuples, arrays with their dtypes, Python scalars
exactly (floats round-trip through `repr`, ints of any size, so the 128-bit state of `PCG64`
survives). No pickle either way: `save` stores only arrays without objects (checked leaf by
leaf, so `np.savez` has nothing to pickle; NumPy < 2.1's `savez` has no `allow_pickle`
argument and would store one as an array member), and `load` reads with
`allow_pickle=False`: a checkpoint file cannot run code when loaded.

A path is written atomically: to a temporary file in the same folder, flushed to disk,
then renamed over the target, so a crash never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

__all__ = ["load", "save"]

# np.savez without allow_pickle: NumPy < 2.1 has no such argument (it would store it as an
# array member); the members are checked to hold no objects, so nothing is pickled. Typed
# as Any because NumPy's stubs read a ** of arrays as a candidate for allow_pickle.
_savez: Any = np.savez

_TREE_KEY = "__normlab_checkpoint__"
_FORMAT = "normlab-checkpoint"
_VERSION = 1
_SCALARS = (bool, int, float, str, type(None))


class _Encoder:
    """Walks a tree: arrays into `self.arrays` (by member name), the rest into JSON nodes."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def member(self, path: str, arr: np.ndarray) -> str:
        if arr.dtype.kind not in "biufcUSM?" or arr.dtype.hasobject:
            raise TypeError(f"state{path or '[root]'} has dtype {arr.dtype}, which np.savez "
                            "cannot store without pickle; convert it (e.g. to float32)")
        name = "state" + path  # the prefix keeps names clear of np.savez keywords
        base, n = name, 1
        while name in self.arrays or name == _TREE_KEY:
            name, n = f"{base}#{n}", n + 1
        self.arrays[name] = arr
        return name

    def node(self, value: Any, path: str) -> dict[str, Any]:
        if isinstance(value, np.ndarray):
            return {"t": "array", "name": self.member(path, value)}
        if isinstance(value, np.generic):
            return {"t": "scalar", "name": self.member(path, np.asarray(value))}
        if isinstance(value, _SCALARS):
            return {"t": "value", "v": value}
        if isinstance(value, Mapping):
            items = []
            for key, item in value.items():
                if isinstance(key, (bool, np.bool_)) or not isinstance(key, (str, int,
                                                                           np.integer)):
                    raise TypeError(f"state{path} has key {key!r}: keys must be str or int")
                key = key if isinstance(key, str) else int(key)
                items.append([key, self.node(item, f"{path}/{key}")])
            return {"t": "dict", "items": items}
        if isinstance(value, (list, tuple)):
            kind = "list" if isinstance(value, list) else "tuple"
            return {"t": kind, "items": [self.node(v, f"{path}/{i}")
                                         for i, v in enumerate(value)]}
        raise TypeError(
            f"state{path or '[root]'} is a {type(value).__name__}; a checkpoint holds dicts, "
            "lists, tuples, numpy arrays and scalars, and Python int/float/bool/str/None"
        )


def _decode(node: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    kind = node["t"]
    if kind == "value":
        return node["v"]
    if kind == "array":
        return arrays[node["name"]]
    if kind == "scalar":
        return arrays[node["name"]][()]
    if kind == "dict":
        return {key: _decode(item, arrays) for key, item in node["items"]}
    items = [_decode(item, arrays) for item in node["items"]]
    return items if kind == "list" else tuple(items)


def save(file: str | os.PathLike[str] | IO[bytes], state: Any) -> Path | None:
    """Write `state` (a tree of dicts, lists, arrays and scalars) to one `.npz` file.

    Parameters
    ----------
    file : path or binary file object
        A path gets `.npz` appended when it lacks it (as `np.savez` does) and is written
        atomically (temporary file, fsync, rename); a file object is written as is.
    state : dict
        The tree, e.g. `{"model": m.state_dict(), "optimizer": opt.state_dict()}`.

    Returns
    -------
    pathlib.Path or None
        The path written (None for a file object).

    Raises
    ------
    TypeError
        A leaf or key that cannot be stored without pickle (the path names it).

    Examples
    --------
    >>> import io
    >>> buf = io.BytesIO()
    >>> save(buf, {"step": 3, "w": np.arange(2.0), "betas": (0.9, 0.999), 7: None})
    >>> _ = buf.seek(0); load(buf)
    {'step': 3, 'w': array([0., 1.]), 'betas': (0.9, 0.999), 7: None}
    """
    enc = _Encoder()
    tree = {"format": _FORMAT, "version": _VERSION, "root": enc.node(state, "")}
    text = json.dumps(tree, allow_nan=True)
    members = {**enc.arrays, _TREE_KEY: np.array(text)}
    if not isinstance(file, (str, os.PathLike)):
        _savez(file, **members)
        return None
    path = Path(file)
    if path.suffix != ".npz":
        path = path.with_name(path.name + ".npz")
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            _savez(fh, **members)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def load(file: str | os.PathLike[str] | IO[bytes]) -> Any:
    """Read a tree written by [save][normlab.checkpoint.save] (`allow_pickle=False`).

    Raises
    ------
    ValueError
        The file is an `.npz` but not a normlab checkpoint (use `np.load` for it), or was
        written by a newer version of this format.
    """
    with np.load(file, allow_pickle=False) as npz:
        if _TREE_KEY not in npz.files:
            raise ValueError(f"{file!r} is not a normlab checkpoint (no {_TREE_KEY!r} member); "
                             "read plain .npz files with np.load")
        tree = json.loads(str(npz[_TREE_KEY][()]))
        if tree.get("format") != _FORMAT or tree.get("version") != _VERSION:
            raise ValueError(f"{file!r} has checkpoint format {tree.get('format')!r} version "
                             f"{tree.get('version')!r}; this normlab reads version {_VERSION}")
        arrays = {name: npz[name] for name in npz.files if name != _TREE_KEY}
    return _decode(tree["root"], arrays)
