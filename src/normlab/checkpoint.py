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

A path is written atomically: to a temporary file in the same folder (`.NAME.XXXX.tmp`,
created like any file, so its mode is 0o666 minus the umask), flushed to disk, then renamed
over the target, so a crash never leaves a half-written checkpoint. The writer holds an
`flock` on its temporary file; the next `save` to the same path deletes the temporary files
whose lock nobody holds (left by a writer that was killed).

Loading reads lazily and checks before it allocates: only the members the tree references
are read, each once, and each member's `.npy` header (dtype, shape) must match its size
in the archive before any memory is taken for it, so a small file cannot make `load`
allocate more than the arrays it really holds. Every malformed file (not a zip, a `.npy` or
text file, a forged tree: unknown node types, missing or shared members, wrong keys, too
deep) raises ValueError naming the problem.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import secrets
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import IO, Any

import numpy as np

try:
    import fcntl
except ImportError:  # not POSIX: no locks, and no clean-up of killed writers' files
    fcntl = None  # type: ignore[assignment]

__all__ = ["load", "save"]

# np.savez without allow_pickle: NumPy < 2.1 has no such argument (it would store it as an
# array member); the members are checked to hold no objects, so nothing is pickled. Typed
# as Any because NumPy's stubs read a ** of arrays as a candidate for allow_pickle.
_savez: Any = np.savez

_TREE_KEY = "__normlab_checkpoint__"
_FORMAT = "normlab-checkpoint"
_VERSION = 1
_SCALARS = (bool, int, float, str, type(None))
_KINDS = "biufcUSM?"  # the dtype kinds a checkpoint stores (no objects, no structures)
_NODES = ("value", "array", "scalar", "dict", "list", "tuple")
_CHUNK = 1 << 18  # bytes read at a time: memory grows with the data found, not the claims


class _Encoder:
    """Walks a tree: arrays into `self.arrays` (by member name), the rest into JSON nodes."""

    def __init__(self) -> None:
        self.arrays: dict[str, np.ndarray] = {}

    def member(self, path: str, arr: np.ndarray) -> str:
        if arr.dtype.kind not in _KINDS or arr.dtype.hasobject:
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


class _Decoder:
    """Rebuilds the tree, reading each member it references once, when it is reached."""

    def __init__(self, archive: zipfile.ZipFile, where: str) -> None:
        self.archive, self.where = archive, where
        self.members = {n[:-4]: n for n in archive.namelist() if n.endswith(".npy")}
        self.used: set[str] = set()

    def bad(self, problem: str) -> ValueError:
        return ValueError(f"{self.where} is not a valid normlab checkpoint: {problem}")

    def array(self, name: Any, path: str) -> np.ndarray:
        if not isinstance(name, str) or name == _TREE_KEY or name not in self.members:
            raise self.bad(f"state{path or '[root]'} names the member {name!r}, which the "
                           "file does not hold")
        if name in self.used:  # save writes one member per leaf
            raise self.bad(f"state{path or '[root]'} names the member {name!r} a second time")
        self.used.add(name)
        return _read_member(self.archive, self.members[name], self.where)

    def node(self, node: Any, path: str) -> Any:
        where = f"state{path or '[root]'}"
        kind = node.get("t") if isinstance(node, dict) else None
        if kind not in _NODES:
            raise self.bad(f"{where} is a node of unknown type {kind!r} (known: {_NODES})")
        if kind == "value":
            value = node.get("v")
            if not isinstance(value, _SCALARS):
                raise self.bad(f"{where} holds a {type(value).__name__}, not a scalar")
            return value
        if kind in ("array", "scalar"):
            arr = self.array(node.get("name"), path)
            if kind == "scalar":
                if arr.ndim != 0:
                    raise self.bad(f"{where} is a scalar but its member has shape {arr.shape}")
                return arr[()]
            return arr
        items = node.get("items")
        if not isinstance(items, list):
            raise self.bad(f"{where} ({kind}) has no list of items")
        if kind != "dict":
            values = [self.node(item, f"{path}/{i}") for i, item in enumerate(items)]
            return values if kind == "list" else tuple(values)
        out: dict[Any, Any] = {}
        for item in items:
            key = item[0] if isinstance(item, list) and len(item) == 2 else None
            if type(key) not in (str, int):
                raise self.bad(f"{where} has an entry {str(item)[:80]!r}; entries are "
                               "[key, node] pairs with a str or int key")
            if key in out:
                raise self.bad(f"{where} has the key {key!r} twice")
            out[key] = self.node(item[1], f"{path}/{key}")
        return out


def _read_member(archive: zipfile.ZipFile, member: str, where: str) -> np.ndarray:
    """One `.npy` member of `archive`, its header checked against its size before reading.

    Raises ValueError when the header is malformed, declares a dtype a checkpoint does not
    hold (objects, structures), or a shape whose bytes differ from what the member holds.
    """
    fmt = np.lib.format
    info = archive.getinfo(member)
    try:
        with archive.open(info) as fh:
            version = fmt.read_magic(fh)
            if version == (1, 0):
                shape, fortran, dtype = fmt.read_array_header_1_0(fh)
            elif version == (2, 0):
                shape, fortran, dtype = fmt.read_array_header_2_0(fh)
            else:
                raise ValueError(f".npy format version {version} is not one save writes")
            if dtype.kind not in _KINDS or dtype.hasobject:
                raise ValueError(f"dtype {dtype} is not one a checkpoint holds")
            nbytes = math.prod(shape) * dtype.itemsize
            if info.file_size - fh.tell() != nbytes:
                raise ValueError(f"its header declares shape {shape} of {dtype} "
                                 f"({nbytes} bytes) but it holds {info.file_size - fh.tell()}")
            data = _read_exactly(fh, nbytes, _present(archive, info, nbytes))
    except (ValueError, OSError, EOFError, zipfile.BadZipFile, RuntimeError,
            NotImplementedError) as exc:
        raise ValueError(f"{where} is not a valid normlab checkpoint: member "
                         f"{member!r}: {exc}") from None
    if dtype.itemsize == 0 or nbytes == 0:
        return np.empty(shape, dtype, order="F" if fortran else "C")
    flat = (data.view(dtype) if isinstance(data, np.ndarray)  # writable, no copy
            else np.frombuffer(data, dtype=dtype))
    return flat.reshape(shape, order="F" if fortran else "C")


def _present(archive: zipfile.ZipFile, info: zipfile.ZipInfo, nbytes: int) -> bool:
    """Whether the member's bytes are surely in the file: stored uncompressed (as np.savez
    writes) and lying before the archive's directory. Then they can be read in place."""
    end = getattr(archive, "start_dir", None)
    return (info.compress_type == zipfile.ZIP_STORED and info.compress_size == info.file_size
            and isinstance(end, int) and info.header_offset + info.compress_size <= end
            and nbytes <= info.compress_size)


def _read_exactly(fh: IO[bytes], nbytes: int, present: bool) -> np.ndarray | bytearray:
    """`nbytes` bytes of `fh` in a writable buffer, or ValueError. Allocated at once
    (uninitialised, as np.load does) when they are `present`; else the buffer grows with
    what is read, so a false size claim costs nothing."""
    data: np.ndarray | bytearray = np.empty(nbytes, np.uint8) if present else bytearray()
    got = 0
    while got < nbytes:
        chunk = fh.read(min(_CHUNK, nbytes - got))
        if not chunk:
            raise ValueError(f"its data ends after {got} of {nbytes} bytes")
        if isinstance(data, np.ndarray):
            data[got:got + len(chunk)] = np.frombuffer(chunk, np.uint8)
        else:
            data += chunk
        got += len(chunk)
    return data


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
    _clear_dead_writers(path)
    fd, tmp = _temporary(path)
    try:
        with os.fdopen(fd, "wb") as fh:  # closing it releases the lock
            _savez(fh, **members)
            fh.flush()
            os.fsync(fh.fileno())
            os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    return path


def _temporary(path: Path) -> tuple[int, Path]:
    """A new `.NAME.XXXX.tmp` beside `path`, locked (flock) for as long as it is open.

    Created with `os.open(..., 0o666)`, so the umask sets its mode as for any new file
    (`tempfile.mkstemp` would make it 0o600).
    """
    for _ in range(100):
        tmp = path.with_name(f".{path.name}.{secrets.token_hex(4)}.tmp")
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
        except FileExistsError:
            continue
        if fcntl is None:
            return fd, tmp
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:  # a file system without flock (ENOLCK): write it unlocked
            return fd, tmp
        with contextlib.suppress(OSError):  # still ours: no clean-up took it in between
            if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                return fd, tmp
        os.close(fd)
    raise FileExistsError(f"no free name for a temporary file beside {str(path)!r}")


def _clear_dead_writers(path: Path) -> None:
    """Delete `.NAME.*.tmp` files beside `path` whose writer is gone (nobody holds the lock)."""
    if fcntl is None:
        return
    pattern = re.compile(rf"^\.{re.escape(path.name)}\.[A-Za-z0-9_]+\.tmp$")
    try:
        names = [n for n in os.listdir(path.parent or ".") if pattern.match(n)]
    except OSError:
        return
    for name in names:
        tmp = path.with_name(name)
        try:
            fd = os.open(tmp, os.O_RDONLY)
        except OSError:
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # granted: its writer is gone
            if os.stat(tmp).st_ino == os.fstat(fd).st_ino:
                tmp.unlink()
        except OSError:  # locked: a writer is at work; or it went away meanwhile
            pass
        finally:
            os.close(fd)


def load(file: str | os.PathLike[str] | IO[bytes]) -> Any:
    """Read a tree written by [save][normlab.checkpoint.save] (no pickle, lazily).

    Only the members the tree references are read, each checked against its declared
    shape before memory is allocated for it; every leaf is an array of its own.

    Raises
    ------
    ValueError
        The file is not a zip archive (e.g. a `.npy` or a text file: the message says
        which), is an `.npz` but not a normlab checkpoint (use `np.load` for it), was
        written by a newer version of this format, or is malformed (the message names
        the node or member at fault).
    OSError
        The path cannot be opened.
    """
    where = repr(os.fspath(file)) if isinstance(file, (str, os.PathLike)) else "the file"
    with contextlib.ExitStack() as stack:
        fh = file if not isinstance(file, (str, os.PathLike)) else stack.enter_context(
            open(file, "rb"))  # closed by the stack
        _check_zip(fh, where)
        try:
            archive = stack.enter_context(zipfile.ZipFile(fh))
        except (zipfile.BadZipFile, OSError, ValueError, EOFError) as exc:
            raise ValueError(f"{where} is not a valid normlab checkpoint: {exc}") from None
        if f"{_TREE_KEY}.npy" not in archive.namelist():
            raise ValueError(f"{where} is not a normlab checkpoint (no {_TREE_KEY!r} member); "
                             "read plain .npz files with np.load")
        decoder = _Decoder(archive, where)
        text = _read_member(archive, f"{_TREE_KEY}.npy", where)
        try:
            tree = json.loads(str(text[()])) if text.ndim == 0 else None
        except (ValueError, RecursionError):
            tree = None
        if not isinstance(tree, dict):
            raise decoder.bad(f"its {_TREE_KEY!r} member is not the JSON object save writes")
        if tree.get("format") != _FORMAT or tree.get("version") != _VERSION:
            raise ValueError(f"{where} has checkpoint format {tree.get('format')!r} version "
                             f"{tree.get('version')!r}; this normlab reads version {_VERSION}")
        try:
            return decoder.node(tree.get("root"), "")
        except RecursionError:
            raise decoder.bad("its tree is nested too deeply") from None


def _check_zip(fh: IO[bytes], where: str) -> None:
    """ValueError unless `fh` starts like a zip archive (its position is kept)."""
    start = fh.tell()
    head = fh.read(6)
    fh.seek(start)
    if head[:2] == b"PK":
        return
    if head.startswith(b"\x93NUMPY"):
        raise ValueError(f"{where} is a .npy file (one array), not a normlab checkpoint (an "
                         ".npz archive written by normlab.checkpoint.save); read it with np.load")
    raise ValueError(f"{where} is not a normlab checkpoint: a checkpoint is an .npz (zip) "
                     f"archive written by normlab.checkpoint.save; this file starts with "
                     f"{head!r}")
