"""Replacing a report folder (normlab.lab._swap): nothing earlier is lost, whatever fails.

The folders are made by hand (a report is report.md, metrics.json, figures/ and the
sub-report folders of `normlab run NAME`, each holding a metrics.json), so these tests
run no experiment. Failures are planted by replacing one step of the swap.
"""

from __future__ import annotations

import os
import stat
import threading
from pathlib import Path

import pytest

from normlab.cli import main
from normlab.lab import _swap
from normlab.lab._swap import check_out_dir, staged_folder


def _report(folder: Path, tag: str, subs: tuple[str, ...] = ()) -> Path:
    (folder / "figures").mkdir(parents=True)
    (folder / "report.md").write_text(f"report {tag}")
    (folder / "metrics.json").write_text(f'{{"tag": "{tag}"}}')
    for name in subs:
        _report(folder / name, f"{tag}/{name}")
    return folder


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _hidden(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.rglob(".*"))


def _write(out: Path, tag: str) -> None:
    with staged_folder(out) as stage:
        _report(stage, tag)


def test_a_swap_that_fails_in_one_step_keeps_every_sub_report(tmp_path, monkeypatch):
    out = _report(tmp_path / "rep", "old", ("run_a", "run_b", "run_c"))
    before = _snapshot(out)

    def broken(a, b):
        raise OSError("the exchange failed")

    monkeypatch.setattr(_swap, "_exchange", broken)
    with pytest.raises(OSError, match="the exchange failed"):
        _write(out, "new")
    assert _snapshot(out) == before  # the three runs are still there, byte for byte
    assert _hidden(tmp_path) == []


def test_a_two_rename_swap_that_fails_halfway_restores_the_report(tmp_path, monkeypatch):
    out = _report(tmp_path / "rep", "old", ("run_a", "run_b"))
    before = _snapshot(out)
    rename = os.rename

    def failing_rename(src, dst):
        if Path(dst) == out and ".new-" in Path(src).name:
            raise OSError("the second rename failed")
        return rename(src, dst)

    monkeypatch.setattr(_swap, "_exchange", lambda a, b: False)  # no renameat2 here
    monkeypatch.setattr(_swap.os, "rename", failing_rename)
    with pytest.raises(OSError, match="second rename"):
        _write(out, "new")
    assert _snapshot(out) == before
    assert _hidden(tmp_path) == []


def test_a_report_waits_for_a_run_writing_inside_its_folder(tmp_path):
    # `normlab run X` staging inside normlab-report/ while `normlab report` replaces it:
    # the report's swap must not delete the run's staging folder (it used to, and the run
    # died with FileNotFoundError), and the run's result must end up in the new report
    out = _report(tmp_path / "rep", "old", ("run_a",))
    staged, release = threading.Event(), threading.Event()
    errors: list[BaseException] = []

    def run_x() -> None:
        try:
            with staged_folder(out / "run_x") as stage:
                (stage / "report.md").write_text("report x")  # metrics.json comes last
                staged.set()
                assert release.wait(60)
                (stage / "metrics.json").write_text('{"tag": "x"}')
        except BaseException as exc:  # reported by the main thread
            errors.append(exc)
            staged.set()

    def report() -> None:
        try:
            _write(out, "new")
        except BaseException as exc:
            errors.append(exc)

    runner = threading.Thread(target=run_x)
    runner.start()
    assert staged.wait(60)
    writer = threading.Thread(target=report)
    writer.start()
    writer.join(2.0)  # gives the report time to swap if nothing holds it back
    release.set()
    runner.join(60)
    writer.join(60)
    assert errors == []
    assert (out / "report.md").read_text() == "report new"
    assert (out / "run_x" / "report.md").read_text() == "report x"  # the run's result kept
    assert (out / "run_a" / "report.md").read_text() == "report old/run_a"
    assert _hidden(tmp_path) == []


def test_leftovers_of_a_killed_writer_are_cleared_and_carried_runs_returned(tmp_path):
    out = _report(tmp_path / "rep", "old")
    _report(tmp_path / ".rep.new-0a1b2c3d", "half-written")  # killed while rendering
    carrying = tmp_path / ".rep.new-9f8e7d6c"  # killed while moving a sub-report over
    carrying.mkdir()
    _report(carrying / "run_a", "old/run_a")
    user = tmp_path / ".notes.old-20240101"  # someone else's folder of a similar name
    user.mkdir()
    (user / "mine.txt").write_text("keep")
    _write(out, "new")
    assert (out / "run_a" / "report.md").read_text() == "report old/run_a"
    assert _hidden(tmp_path) == [".notes.old-20240101"]
    assert (user / "mine.txt").read_text() == "keep"


def test_a_report_moved_aside_by_a_killed_two_rename_swap_comes_back(tmp_path):
    aside = tmp_path / ".rep.old-0a1b2c3d"
    aside.mkdir()
    _report(aside / "report", "old", ("run_a",))
    _write(tmp_path / "rep", "new")
    assert (tmp_path / "rep" / "report.md").read_text() == "report new"
    assert (tmp_path / "rep" / "run_a" / "report.md").read_text() == "report old/run_a"
    assert _hidden(tmp_path) == []


def test_a_symbolic_link_as_out_is_refused_and_kept(tmp_path, capsys):
    target = _report(tmp_path / "real", "old")
    link = tmp_path / "link"
    link.symlink_to(target)
    with pytest.raises(ValueError, match="symbolic link"):
        check_out_dir(link)
    assert main(["run", "invariance", "--quick", "--out", str(link)]) == 2
    err = capsys.readouterr().err
    assert "symbolic link" in err and "Traceback" not in err
    assert link.is_symlink() and (target / "report.md").read_text() == "report old"


def test_the_report_folder_mode_follows_the_umask(tmp_path):
    previous = os.umask(0o027)
    try:
        _write(tmp_path / "rep", "new")
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "rep").stat().st_mode) == 0o750  # 0o777 & ~0o027
