"""Replace a report folder all at once: stage beside it, then swap it in.

Contract: `staged_folder(out)` yields a new empty hidden folder beside `out`
(`.NAME.new-XXXX`, its mode 0o777 minus the umask, as `mkdir` makes it); when the `with`
block ends normally the staged folder becomes `out` in one step
(`renameat2(RENAME_EXCHANGE)` where the OS has it, else two renames with `out` briefly
absent, never mixed), the old one is deleted, and sub-reports of `normlab run NAME`
inside the old folder move into the new one. An exception or Ctrl-C inside the block
deletes the staged folder and leaves `out` as it was; Ctrl-C during the swap is held back
until the swap is done. A swap that fails part-way moves the sub-reports back: an earlier
result is never deleted (a staged folder that still holds one is left for the next run).

Locks (POSIX `flock` on the folders themselves, so no lock file is left behind): a writer
holds a shared lock on the folder that holds `out` from staging to swap ("something of
mine is in flight in here"), and the swap takes an exclusive lock on `out`. So
`normlab report` (replacing `normlab-report/`) waits for a `normlab run NAME` that is
writing `normlab-report/NAME/`, and that run, started during the report's swap, stages
in the new folder; two writers into one folder render side by side and swap one after
the other, each whole. A lock is checked again after it is granted (a swap may have put
another folder under the name meanwhile).

Crash leftovers (SIGKILL, power loss): `.NAME.new-*` and `.NAME.old-*` folders. A writer
that finds no other writer in flight in its folder (an exclusive lock granted without
waiting) removes them first; sub-reports a dead swap was moving go back to their
report, and a report a dead two-rename swap had moved aside goes back under its name.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import re
import secrets
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

try:
    import fcntl
except ImportError:  # not POSIX: no locks; each swap is still all or nothing
    fcntl = None  # type: ignore[assignment]

__all__ = ["REPORT_ENTRIES", "check_out_dir", "staged_folder"]

# what a report folder holds; anything else (except sub-report folders) is not ours to delete
REPORT_ENTRIES = frozenset({"report.md", "report.html", "metrics.json", "figures"})


_OWN_HIDDEN = re.compile(r"^\..+(\.lock|\.(new|old|probe)-[A-Za-z0-9_]+)$")
# staging names: 8 random characters (tempfile's before, hex now)
_STAGING = re.compile(r"^\.(?P<name>.+)\.(?P<kind>new|old)-[a-z0-9_]{8}$")
_RENAME_NOREPLACE, _RENAME_EXCHANGE = 1, 2


def _is_sub_report(entry: Path) -> bool:
    return entry.is_dir() and not entry.is_symlink() and (entry / "metrics.json").is_file()


def _is_ours(entry: Path) -> bool:
    """A report file, a sub-report, or the lock/staging entry of a sub-report's swap."""
    return entry.name in REPORT_ENTRIES or _is_sub_report(entry) or bool(
        _OWN_HIDDEN.match(entry.name)
    )


def check_out_dir(out: str | Path) -> None:
    """Raise ValueError unless `out` can be written as a report folder (nothing is changed).

    `out` may be missing (its parents are created), empty, or an earlier report
    (report.md, report.html, metrics.json, figures/, sub-folders holding a metrics.json
    such as `normlab run NAME` writes, and the hidden lock and staging entries of their
    swaps). The folder it lives in must be
    writable: a probe folder is created there and removed.

    Raises
    ------
    ValueError
        `out` names no folder, is a file or a symbolic link, holds files that are not part
        of a report, or lies where nothing can be written.

    Examples
    --------
    >>> check_out_dir("normlab-report")  # doctest: +SKIP
    """
    path = Path(out)
    if str(out) == "" or path.name in ("", ".", ".."):
        raise ValueError(f"{str(out)!r} is not a folder name that can be replaced; name a folder")
    if path.is_symlink():
        raise ValueError(
            f"{str(out)!r} is a symbolic link (to {os.readlink(path)!r}); a report replaces "
            "its folder whole and would replace the link: name the folder itself or a new one"
        )
    if path.exists() and not path.is_dir():
        raise ValueError(f"{str(out)!r} is a file, not a folder; name a folder (new or a report)")
    if path.is_dir():
        foreign = sorted(e.name for e in path.iterdir() if not _is_ours(e))
        if foreign:
            raise ValueError(
                f"{str(out)!r} holds files that are not part of a normlab report "
                f"(e.g. {foreign[0]!r}); name a new or empty folder, or an earlier report's"
            )
    parent = path.absolute().parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir():
        raise ValueError(f"{str(out)!r} lies under {str(parent)!r}, which is a file; name a folder")
    try:
        os.rmdir(tempfile.mkdtemp(prefix=f".{path.name}.probe-", dir=parent))
    except OSError as exc:
        raise ValueError(
            f"cannot write a report beside {str(out)!r}: {exc.strerror or exc}; "
            "name a folder in a writable place"
        ) from None


def _fresh_folder(parent: Path, prefix: str) -> Path:
    """A new empty folder `parent/prefix<random>`, mode 0o777 minus the umask (as `mkdir`
    makes a folder; `tempfile.mkdtemp` would make it 0o700 whatever the umask)."""
    for _ in range(100):
        path = parent / f"{prefix}{secrets.token_hex(4)}"
        try:
            os.mkdir(path, 0o777)
        except FileExistsError:
            continue
        return path
    raise FileExistsError(f"no free name for a folder {prefix}* in {str(parent)!r}")


def _lock(folder: Path, operation: int) -> int | None:
    """A descriptor holding `flock(operation)` on the folder `folder` names now.

    None where there is nothing to lock: no `flock` (not POSIX, or a file system without
    it), or the folder is missing or unreadable. With `LOCK_NB` a lock held elsewhere
    raises BlockingIOError.
    """
    if fcntl is None:
        return None
    for _ in range(1000):
        try:
            fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        except OSError:
            return None
        try:
            fcntl.flock(fd, operation)
            now, held = os.stat(folder), os.fstat(fd)
        except BlockingIOError:  # LOCK_NB: held elsewhere
            os.close(fd)
            raise
        except OSError:  # gone once granted, or a file system without flock (ENOLCK)
            os.close(fd)
            return None
        except BaseException:
            os.close(fd)
            raise
        if (now.st_dev, now.st_ino) == (held.st_dev, held.st_ino):
            return fd
        os.close(fd)  # a swap put another folder under this name meanwhile: lock that one
    raise RuntimeError(f"{str(folder)!r} kept changing while it was being locked")


def _unlock(fd: int | None) -> None:
    if fd is not None:
        os.close(fd)  # closing releases the lock


@contextlib.contextmanager
def _interrupts_held() -> Iterator[None]:
    """Hold SIGINT back (main thread only) and raise KeyboardInterrupt once the block ends."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    seen: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: seen.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if seen:
        raise KeyboardInterrupt


def _renameat2(a: Path, b: Path, flags: int) -> int | None:
    """Linux `renameat2(a, b, flags)`: 0, or the errno; None where the OS lacks it."""
    try:
        renameat2 = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    at_fdcwd = -100
    if renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), flags) == 0:
        return 0
    err = ctypes.get_errno()
    return None if err in (errno.ENOSYS, errno.EINVAL) else err


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2); False where unsupported."""
    return _renameat2(a, b, _RENAME_EXCHANGE) == 0


def _rename_new(src: Path, dst: Path) -> bool:
    """Rename `src` to `dst` unless something is there by now (False then)."""
    err = _renameat2(src, dst, _RENAME_NOREPLACE)
    if err is None:  # no renameat2: a plain rename (it fails on a non-empty folder)
        try:
            os.rename(src, dst)
        except OSError as exc:
            if exc.errno in (errno.EEXIST, errno.ENOTEMPTY, errno.EISDIR):
                return False
            raise
        return True
    if err in (errno.EEXIST, errno.ENOTEMPTY):
        return False
    if err:
        raise OSError(err, os.strerror(err), str(dst))
    return True


def _sub_reports(folder: Path) -> list[Path]:
    return sorted(e for e in folder.iterdir()
                  if e.name not in REPORT_ENTRIES and _is_sub_report(e))


def _swap_in(stage: Path, out: Path) -> None:
    """Replace the existing `out` by `stage`, carrying `out`'s sub-reports over.

    On failure everything moved goes back: `out` keeps its report and its sub-reports.
    """
    moved: list[str] = []
    try:
        for entry in _sub_reports(out):  # sub-reports of `normlab run NAME` stay with out
            os.rename(entry, stage / entry.name)
            moved.append(entry.name)
        if _exchange(stage, out):
            return  # stage now holds the old report, without its sub-reports
        old = _fresh_folder(out.parent, f".{out.name}.old-")
        os.rename(out, old / "report")
        try:
            os.rename(stage, out)
        except BaseException:
            os.rename(old / "report", out)
            os.rmdir(old)
            raise
        shutil.rmtree(old, ignore_errors=True)
    except BaseException:
        for name in moved:
            with contextlib.suppress(OSError):  # one left in stage keeps stage alive
                os.rename(stage / name, out / name)
        raise


def _swap(stage: Path, out: Path) -> None:
    """Make `stage` the folder `out`, under an exclusive lock on the `out` it replaces."""
    for _ in range(100):
        if out.is_symlink() or (out.exists() and not out.is_dir()):
            raise ValueError(f"{str(out)!r} became a file or a symbolic link; the report was "
                             "not written there (name a folder)")
        if not out.exists():
            with _interrupts_held():
                if _rename_new(stage, out):
                    return
            continue  # another writer made `out` meanwhile: replace that one
        fd = _lock(out, fcntl.LOCK_EX if fcntl is not None else 0)  # Ctrl-C may stop a wait
        try:
            if out.is_dir() and not out.is_symlink():
                with _interrupts_held():
                    _swap_in(stage, out)
                return
        finally:
            _unlock(fd)
    raise RuntimeError(f"{str(out)!r} kept changing during the swap")


def _discard(stage: Path) -> None:
    """Delete a staged folder, unless it holds a sub-report (then the next run returns it)."""
    if stage.is_dir() and not _sub_reports(stage):
        shutil.rmtree(stage, ignore_errors=True)


def _recover(parent: Path) -> None:
    """Clear the staging leftovers of dead writers in `parent` (no writer is in flight).

    A sub-report a dead swap was carrying goes back to its report; a report a dead
    two-rename swap had moved aside goes back under its name; the rest is deleted.
    """
    for entry in list(parent.iterdir()):
        found = _STAGING.match(entry.name)
        if found is None or entry.is_symlink() or not entry.is_dir():
            continue
        target = parent / found["name"]
        held = entry / "report" if found["kind"] == "old" else entry
        inside = [e.name for e in entry.iterdir()]
        if (inside not in ([], ["report"]) if found["kind"] == "old"
                else not all(_is_ours(e) for e in entry.iterdir())):
            continue  # not shaped like a report's staging folder: not ours to touch
        try:
            if found["kind"] == "old" and held.is_dir() and not os.path.lexists(target):
                os.rename(held, target)
            elif held.is_dir() and target.is_dir() and not target.is_symlink():
                for sub in _sub_reports(held):
                    if not os.path.lexists(target / sub.name):
                        os.rename(sub, target / sub.name)
            if not (held.is_dir() and _sub_reports(held)):
                shutil.rmtree(entry, ignore_errors=True)
        except OSError:  # best effort: what cannot be returned now stays for a later run
            continue


def _enter(parent: Path) -> int | None:
    """The shared lock of a writer in `parent`; first, when no other writer is in flight
    there, clear dead writers' leftovers."""
    if fcntl is None:
        return None
    try:
        fd = _lock(parent, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:  # others are writing here: their folders are not leftovers
        return _lock(parent, fcntl.LOCK_SH)
    if fd is None:
        return None
    try:
        _recover(parent)
        fcntl.flock(fd, fcntl.LOCK_SH)
    except BaseException:
        os.close(fd)
        raise
    return fd


@contextlib.contextmanager
def staged_folder(out: str | Path) -> Iterator[Path]:
    """Yield an empty folder beside `out`; on success it replaces `out` whole."""
    out = Path(out).absolute()
    out.parent.mkdir(parents=True, exist_ok=True)
    held = _enter(out.parent)
    try:
        stage = _fresh_folder(out.parent, f".{out.name}.new-")
        try:
            yield stage
            _swap(stage, out)
        finally:
            _discard(stage)
    finally:
        _unlock(held)
