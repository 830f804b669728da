"""Replace a report folder all at once: stage beside it, then swap under a lock.

Contract: `staged_folder` yields a new empty hidden folder beside `out`
(`.NAME.new-XXXX`); when the `with` block ends normally the staged folder becomes
`out` in one step (`renameat2(RENAME_EXCHANGE)` where the OS has it, else two renames
with `out` briefly absent, never mixed), the old one is deleted, and sub-reports of
`normlab run NAME` inside the old folder move into the new one. The swap holds an
exclusive `flock` on the folder that holds `out` (POSIX; the folder itself, so no lock file
is left behind), so concurrent runs into one folder swap one after the other, each whole.
Ctrl-C during the swap is held back until the swap is done; an exception or Ctrl-C inside
the block deletes the staged folder and leaves `out` as it was.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import shutil
import signal
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

__all__ = ["REPORT_ENTRIES", "check_out_dir", "staged_folder"]

# what a report folder holds; anything else (except sub-report folders) is not ours to delete
REPORT_ENTRIES = frozenset({"report.md", "report.html", "metrics.json", "figures"})


_OWN_HIDDEN = re.compile(r"^\..+(\.lock|\.(new|old|probe)-[A-Za-z0-9_]+)$")


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
        `out` names no folder, is a file, holds files that are not part of a report, or
        lies where nothing can be written.

    Examples
    --------
    >>> check_out_dir("normlab-report")  # doctest: +SKIP
    """
    path = Path(out)
    if str(out) == "" or path.name in ("", ".", ".."):
        raise ValueError(f"{str(out)!r} is not a folder name that can be replaced; name a folder")
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


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    """Hold an exclusive flock on `folder` itself: a lock without a lock file to leave."""
    try:
        import fcntl
    except ImportError:  # not POSIX: no lock; the swap itself is still all or nothing
        yield
        return
    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
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


def _exchange(a: Path, b: Path) -> bool:
    """Swap two existing paths in one step (Linux renameat2); False where unsupported."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError):
        return False
    at_fdcwd, rename_exchange = -100, 2
    rc = renameat2(at_fdcwd, os.fsencode(a), at_fdcwd, os.fsencode(b), rename_exchange)
    return bool(rc == 0)


def _swap_in(stage: Path, out: Path) -> None:
    if not out.exists():
        os.rename(stage, out)
        return
    for entry in out.iterdir():  # sub-reports of `normlab run NAME` stay with the folder
        if entry.name not in REPORT_ENTRIES and _is_sub_report(entry):
            os.rename(entry, stage / entry.name)
    if _exchange(stage, out):
        shutil.rmtree(stage)  # stage now holds the old report
        return
    old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
    os.rename(out, old / "report")
    os.rename(stage, out)
    shutil.rmtree(old)


@contextlib.contextmanager
def staged_folder(out: str | Path) -> Iterator[Path]:
    """Yield an empty folder beside `out`; on success it replaces `out` whole."""
    out = Path(out)
    out.absolute().parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f".{out.name}.new-", dir=out.absolute().parent))
    try:
        yield stage
        with _locked(out.absolute().parent), _interrupts_held():
            _swap_in(stage, out)
    finally:
        if stage.exists():
            shutil.rmtree(stage, ignore_errors=True)
