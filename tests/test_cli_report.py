"""The normlab command as a process: usage errors, closed pipes, Ctrl-C, concurrent reports, bars.

Every process runs with a timeout. The experiments are fakes (injected into the registry's
package by a small driver script) so the tests control how long a run and its write take.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import shlex
import signal
import struct
import subprocess
import sys
import termios
import time
from pathlib import Path

import pytest

import normlab
from normlab.cli import main

SRC = str(Path(normlab.__file__).resolve().parents[1])
TIMEOUT = 60

# Fake experiments: each appends its name to $FAKE_MARKER when it starts, sleeps
# $FAKE_SLEEP seconds, and passes; $FAKE_WRITE_SLEEP makes the write phase pause between
# report.md and report.html (touching $FAKE_MARKER.writing first), and $FAKE_WRITE_UNTIL
# makes it wait there until that file exists.
DRIVER = r"""
import os, signal, sys, time, types
# a suite started as a background job hands its children SIGINT ignored; the Ctrl-C tests
# need Python's own handler (what an interactive `normlab report` has)
signal.signal(signal.SIGINT, signal.default_int_handler)
from pathlib import Path
import normlab.lab.experiments as registry
import normlab.lab.report as report
from normlab.lab.result import Check, ExperimentResult

marker = Path(os.environ["FAKE_MARKER"])

def make(name):
    module = types.ModuleType(f"normlab.lab.experiments.{name}")
    module.NAME, module.TITLE = name, f"fake {name}"
    def run(settings, progress):
        with marker.open("a") as f:
            f.write(name + "\n")
        progress.start(3, name)
        for _ in range(3):
            progress.advance()
        time.sleep(float(os.environ.get("FAKE_SLEEP", "0")))
        check = Check("source", "claim", "criterion", "1", True)
        return ExperimentResult(name, f"fake {name}", settings.seed, "summary", checks=[check])
    module.run = run
    sys.modules[module.__name__] = module

for name in registry.EXPERIMENTS:
    make(name)

pause = float(os.environ.get("FAKE_WRITE_SLEEP", "0"))
until = os.environ.get("FAKE_WRITE_UNTIL")
if pause or until:
    html_document = report.html_document
    def slow_html(*args, **kwargs):
        Path(str(marker) + ".writing").touch()
        time.sleep(pause)
        deadline = time.monotonic() + 300
        while until and not Path(until).exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        return html_document(*args, **kwargs)
    report.html_document = slow_html

from normlab.cli import main
sys.exit(main(sys.argv[1:]))
"""


def _env(tmp_path: Path, **extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": SRC, "FAKE_MARKER": str(tmp_path / "marker")}
    env.update(extra)
    return env


def _start(tmp_path: Path, args: list[str], **extra: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-c", DRIVER, *args],
        env=_env(tmp_path, **extra),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _wait_for(path: Path, proc: subprocess.Popen[str]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not path.exists():
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.05)


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


def _previous_report(tmp_path: Path) -> Path:
    out = tmp_path / "rep"
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, "report", "--only", "invariance", "--seed", "1",
         "--out", str(out)],
        env=_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (out / "figures" / "stale-from-an-older-run.png").write_bytes(b"old")
    return out


def _inject_fakes(monkeypatch: pytest.MonkeyPatch, marker: Path) -> None:
    namespace = {"__name__": "fakes"}
    code = DRIVER.split("pause = ")[0]  # the fake experiments only, not the slow write
    monkeypatch.setenv("FAKE_MARKER", str(marker))
    saved = dict(sys.modules)
    exec(compile(code, "fakes", "exec"), namespace)
    for name, module in sys.modules.items():
        if name.startswith("normlab.lab.experiments.") and saved.get(name) is not module:
            monkeypatch.setitem(sys.modules, name, module)


def _usage_cases(tmp_path: Path) -> list[tuple[list[str], str]]:
    a_file = tmp_path / "a-file.txt"
    a_file.write_text("keep me")
    foreign = tmp_path / "my-project"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    return [
        (["report", "--out", str(a_file)], "is a file"),
        (["report", "--out", str(a_file / "sub")], "is a file"),
        (["report", "--out", str(foreign)], "not part of a normlab report"),
        (["report", "--seed", "-1"], "--seed"),
        (["report", "--seed", "x"], "--seed"),
        (["report", "--only", ""], "--only"),
        (["report", "--only", " , "], "--only"),
        (["report", "--only", "invariance,nope"], "nope"),
        (["run", "nope"], "known experiments"),
        (["report", "--quick", "--full"], "not allowed"),
        (["bits", "-1e-3", "--format", "e5m2"], "--format e5m2 -- -1e-3"),
        (["bits", "1", "--format", "e9m99"], "e9m99"),
    ]


def test_usage_errors_are_one_line_exit_2_and_run_nothing(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "marker"
    _inject_fakes(monkeypatch, marker)
    for args, needle in _usage_cases(tmp_path):
        assert main(args) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and needle in err, (args, err)
        assert "Traceback" not in err
        assert not marker.exists(), f"{args} ran an experiment before failing"
    assert (tmp_path / "a-file.txt").read_text() == "keep me"
    assert (tmp_path / "my-project" / "notes.txt").read_text() == "mine"


def test_unwritable_out_folder_is_a_usage_error(tmp_path, monkeypatch, capsys):
    marker = tmp_path / "marker"
    _inject_fakes(monkeypatch, marker)
    if os.geteuid() == 0:  # root writes through permission bits; sysfs refuses even root
        out = "/sys/normlab-report-test"
    else:
        locked = tmp_path / "locked"
        locked.mkdir(mode=0o555)
        out = str(locked / "rep")
    assert main(["report", "--only", "invariance", "--out", out]) == 2
    err = capsys.readouterr().err
    assert "cannot write a report" in err and len(err.strip().splitlines()) == 1
    assert not marker.exists()


def test_internal_type_error_is_not_a_usage_error(tmp_path, monkeypatch):
    import normlab.lab.exercises as exercises

    def broken(number):
        raise TypeError("an internal bug")

    monkeypatch.setattr(exercises, "exercise_text", broken)
    with pytest.raises(TypeError, match="an internal bug"):
        main(["exercise", "16.1"])


def test_usage_error_exit_status_through_the_real_command():
    done = subprocess.run(
        [sys.executable, "-m", "normlab", "report", "--seed", "-1"],
        env={**os.environ, "PYTHONPATH": SRC}, capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert done.returncode == 2 and done.stdout == ""
    assert len(done.stderr.strip().splitlines()) == 1 and "--seed" in done.stderr


def test_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"normlab {normlab.__version__}\n"


def test_closed_pipe_is_quiet():
    proc = subprocess.Popen(
        [sys.executable, "-m", "normlab", "formats"],
        env={**os.environ, "PYTHONPATH": SRC}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    proc.stdout.close()  # the reader is gone before normlab writes a byte
    _, err = proc.communicate(timeout=TIMEOUT)
    assert err == b"" and proc.returncode == 141
    shell = subprocess.run(
        f"set -o pipefail; {shlex.quote(sys.executable)} -m normlab formats | head -1",
        shell=True, executable="/bin/bash", env={**os.environ, "PYTHONPATH": SRC},
        capture_output=True, text=True, timeout=TIMEOUT,
    )  # fmt: skip
    assert shell.stderr == "" and len(shell.stdout.splitlines()) == 1


def _assert_interrupted_cleanly(proc: subprocess.Popen[str], out: Path, before: dict) -> None:
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=TIMEOUT)
    assert proc.returncode == 130, err
    assert "interrupted" in err and "Traceback" not in err
    assert _snapshot(out) == before  # the previous report, byte for byte
    leftovers = sorted(p.name for p in out.parent.iterdir() if p.name.startswith(".rep"))
    assert leftovers == []  # no staged folder and no lock file left behind


def test_ctrl_c_while_experiments_run_keeps_the_previous_report(tmp_path):
    out = _previous_report(tmp_path)
    before = _snapshot(out)
    (tmp_path / "marker").unlink()
    proc = _start(tmp_path, ["report", "--only", "invariance", "--out", str(out)], FAKE_SLEEP="60")
    _wait_for(tmp_path / "marker", proc)
    _assert_interrupted_cleanly(proc, out, before)


def test_ctrl_c_while_the_report_is_written_keeps_the_previous_report(tmp_path):
    out = _previous_report(tmp_path)
    before = _snapshot(out)
    args = ["report", "--only", "invariance,dropout_stats", "--out", str(out)]
    proc = _start(tmp_path, args, FAKE_WRITE_SLEEP="60")
    _wait_for(tmp_path / "marker.writing", proc)  # report.md is already staged
    _assert_interrupted_cleanly(proc, out, before)


def test_concurrent_runs_into_one_folder_never_mix(tmp_path):
    out = _previous_report(tmp_path)
    args = ["report", "--only", "invariance", "--out", str(out)]
    go = tmp_path / "go"  # seed 7 finishes writing only once seed 8 has finished
    slow = _start(tmp_path, [*args, "--seed", "7"], FAKE_WRITE_UNTIL=str(go))
    _wait_for(tmp_path / "marker.writing", slow)  # seed 7 has staged report.md and waits
    fast = _start(tmp_path, [*args, "--seed", "8"], FAKE_WRITE_SLEEP="0.01")
    for proc in (fast, slow):
        _, err = proc.communicate(timeout=TIMEOUT)
        assert proc.returncode == 0, err
        go.touch()
    seed = json.loads((out / "metrics.json").read_text())["settings"]["seed"]
    assert seed == 7  # the slower run swapped last; without staging md would be seed 8's
    assert f"seed `{seed}`" in (out / "report.md").read_text()
    assert f"seed <code>{seed}</code>" in (out / "report.html").read_text() or (
        f"seed {seed}" in (out / "report.html").read_text()
    )
    assert not (out / "figures" / "stale-from-an-older-run.png").exists()


def test_progress_bars_only_on_a_terminal(tmp_path):
    args = [sys.executable, "-c", DRIVER, "run", "invariance", "--out", str(tmp_path / "r")]
    logged = subprocess.run(
        args, env=_env(tmp_path), capture_output=True, text=True, timeout=TIMEOUT
    )
    assert logged.returncode == 0 and logged.stderr == ""  # a log gets no bars at all
    main_fd, replica_fd = pty.openpty()
    fcntl.ioctl(replica_fd, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))  # 100 cols
    try:
        proc = subprocess.Popen(args, env=_env(tmp_path), stdout=subprocess.DEVNULL,
                                stderr=replica_fd)  # fmt: skip
        os.close(replica_fd)
        proc.wait(timeout=TIMEOUT)
        drawn = b""
        while True:
            try:
                chunk = os.read(main_fd, 65536)
            except OSError:  # the terminal's other end is closed: all read
                break
            if not chunk:
                break
            drawn += chunk
    finally:
        os.close(main_fd)
    assert proc.returncode == 0
    assert b"\r" in drawn and b"normlab report" in drawn  # tqdm redraws on a terminal


def test_a_report_folder_keeps_the_single_runs_inside_it(tmp_path, monkeypatch, capsys):
    _inject_fakes(monkeypatch, tmp_path / "marker")
    monkeypatch.chdir(tmp_path)
    assert main(["run", "invariance"]) == 0  # default: normlab-report/invariance/
    assert main(["report", "--only", "dropout_stats", "--seed", "3"]) == 0
    report = tmp_path / "normlab-report"
    assert json.loads((report / "metrics.json").read_text())["settings"]["seed"] == 3
    assert (report / "invariance" / "metrics.json").is_file()  # carried into the new folder
    assert main(["report", "--only", "dropout_stats"]) == 0  # and again: nothing foreign
    assert (report / "invariance" / "report.md").is_file()
    capsys.readouterr()


def test_a_report_leaves_no_lock_file_and_counts_each_verdict(tmp_path, monkeypatch, capsys):
    _inject_fakes(monkeypatch, tmp_path / "marker")
    monkeypatch.chdir(tmp_path)
    assert main(["report", "--only", "invariance,dropout_stats"]) == 0
    assert main(["run", "invariance"]) == 0  # a sub-report swaps inside normlab-report/
    hidden = sorted(p.name for p in tmp_path.rglob(".*") if p.name != ".marker")
    assert hidden == []  # no .normlab-report.lock, no .invariance.lock, no staging folder
    out = capsys.readouterr().out
    assert "2 PASS · 0 FAIL" in out and "1 PASS · 0 FAIL" in out
    assert "experiments passed" not in out  # the old "8 of 13 passed" read as 5 failures


def test_the_summary_counts_not_reproduced_skipped_and_errors_apart():
    from types import SimpleNamespace as Outcome

    from normlab.lab.render import verdict_summary

    hint = 'lowp_training needs PyTorch: pip install ".[torch]"  (from the normlab source tree)'
    outcomes = (
        [Outcome(status="pass", error=None)] * 8
        + [Outcome(status="not reproduced", error=None)] * 4
        + [Outcome(status="skipped", error=hint)]
    )
    assert verdict_summary(outcomes) == (
        '8 PASS · 4 NOT REPRODUCED · 1 SKIPPED (pip install ".[torch]") · 0 FAIL'
    )
    errored = [Outcome(status="error", error="Traceback ..."), Outcome(status="fail", error=None)]
    assert verdict_summary(errored) == "0 PASS · 1 ERROR · 1 FAIL"
    # a status the runner may add later (INCONCLUSIVE) is counted, not dropped
    assert verdict_summary([Outcome(status="inconclusive", error=None)]) == (
        "0 PASS · 1 INCONCLUSIVE · 0 FAIL"
    )
