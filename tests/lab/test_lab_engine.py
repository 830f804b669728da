"""The report engine on fake experiments: files, self-contained HTML, JSON, exit status."""

from __future__ import annotations

import base64
import json
import re
import types

import numpy as np
import pytest

from normlab.lab._markdown import to_html
from normlab.lab.plotting import new_figure
from normlab.lab.report import jsonable, run_report
from normlab.lab.result import Check, ExperimentResult, ExperimentSkipped, NullProgress, Settings
from normlab.lab.runner import exit_status, run_experiments

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _result(name: str, passed: bool, settings: Settings) -> ExperimentResult:
    fig, ax = new_figure()
    ax.plot([1, 2, 3], [1, 4, 9], label="y = x^2")
    ax.set(xlabel="x (units)", ylabel="y (units)", title=f"{name} figure")
    ax.legend()
    return ExperimentResult(
        name=name,
        title=f"Fake {name}",
        seed=settings.seed,
        summary="A fake experiment with a <b>tag</b> and a pipe | in its summary.",
        checks=[
            Check(
                "Fake et al. 2099, Lemma 1",
                "the claim | with a pipe",
                "value within 1 +- 0.1",
                "1.02" if passed else "3.5",
                passed,
                {"value": np.float64(1.02), "arr": np.arange(3), "inf": float("inf")},
            )
        ],
        figures={"curve": fig},
        tables=["| a | b |\n|---|---|\n| 1 | 2 |"],
        metrics={"value": np.float32(1.5), "nan": float("nan")},
        settings={"n": 3},
    )


def _module(name: str, behaviour: str) -> types.SimpleNamespace:
    def run(settings: Settings, progress: object) -> ExperimentResult:
        progress.start(2, name)  # type: ignore[attr-defined]
        progress.advance()  # type: ignore[attr-defined]
        if behaviour == "raise":
            raise RuntimeError("boom inside the fake experiment")
        if behaviour == "wrong":
            return "not a result"  # type: ignore[return-value]
        return _result(name, behaviour == "pass", settings)

    return types.SimpleNamespace(NAME=name, TITLE=f"Fake {name}", run=run)


FAKES = {
    "good": _module("good", "pass"),
    "bad": _module("bad", "fail"),
    "boom": _module("boom", "raise"),
    "wrong": _module("wrong", "wrong"),
}


def test_all_passing_run_writes_every_file_and_exits_zero(tmp_path):
    status, outcomes, files = run_report(
        ["good"], Settings("quick", 7), tmp_path / "out", loader=FAKES.__getitem__
    )
    assert status == 0
    assert [o.status for o in outcomes] == ["pass"]
    for path in (files.markdown, files.html, files.metrics, *files.figures):
        assert path.is_file() and path.stat().st_size > 0
    assert files.figures[0].read_bytes().startswith(PNG_MAGIC)
    md = files.markdown.read_text()
    # the claim sits beside the measured value and the verdict, in one table row
    row = next(line for line in md.splitlines() if "Fake et al. 2099" in line)
    assert "1.02" in row and row.rstrip().endswith("PASS |")
    assert "figures/good-curve.png" in md
    assert "seed `7`" in md and "size `quick`" in md


def test_failure_and_exception_make_exit_status_nonzero_and_others_still_run(tmp_path):
    names = ["boom", "bad", "wrong", "good"]
    status, outcomes, files = run_report(names, Settings(), tmp_path, loader=FAKES.__getitem__)
    assert status == 1
    assert [o.status for o in outcomes] == ["error", "fail", "error", "pass"]
    md = files.markdown.read_text()
    assert "Traceback" in md and "boom inside the fake experiment" in md
    assert "not ExperimentResult" in md
    data = json.loads(files.metrics.read_text())
    assert data["passed"] is False
    assert data["experiments"]["boom"]["status"] == "error"
    assert "RuntimeError" in data["experiments"]["boom"]["error"]
    assert data["experiments"]["bad"]["passed"] is False
    assert data["experiments"]["good"]["passed"] is True


def test_missing_module_is_an_error_outcome_not_a_crash(tmp_path):
    def loader(name: str) -> object:
        raise ImportError(f"No module named {name!r}")

    outcomes = run_experiments(["ghost"], Settings(), loader=loader)
    assert outcomes[0].status == "error" and "ImportError" in (outcomes[0].error or "")
    assert exit_status(outcomes) == 1


def test_an_experiment_without_checks_fails():
    def run(settings: Settings, progress: object) -> ExperimentResult:
        return ExperimentResult("empty", "Empty", settings.seed, "nothing measured")

    module = types.SimpleNamespace(NAME="empty", TITLE="Empty", run=run)
    outcomes = run_experiments(["empty"], Settings(), loader=lambda _: module)
    assert outcomes[0].status == "fail" and exit_status(outcomes) == 1


def test_html_is_self_contained_and_escapes_experiment_text(tmp_path):
    _, _, files = run_report(["good", "bad"], Settings(), tmp_path, loader=FAKES.__getitem__)
    page = files.html.read_text()
    assert page.startswith("<!DOCTYPE html>") and "<style>" in page
    # no external resource of any kind: every src is an embedded PNG, every link in-page
    assert not re.search(r"src\s*=\s*[\"'](?!data:)", page)
    assert not re.search(r"href\s*=\s*[\"'](?!#)", page)
    assert '<a href="#good">' in page and '<a id="good"></a>' in page
    assert "<link" not in page and "<script" not in page
    sources = re.findall(r'src="data:image/png;base64,([^"]+)"', page)
    assert len(sources) == 2
    assert all(base64.b64decode(s).startswith(PNG_MAGIC) for s in sources)
    assert "<b>tag</b>" not in page and "&lt;b&gt;tag&lt;/b&gt;" in page
    assert '<span class="pass">PASS</span>' in page and '<span class="fail">FAIL</span>' in page
    assert "<table>" in page and 'name="viewport"' in page


def test_metrics_json_is_strict_json_with_seeds_sizes_versions_and_times(tmp_path):
    _, _, files = run_report(["good"], Settings("quick", 3), tmp_path, loader=FAKES.__getitem__)
    text = files.metrics.read_text()
    data = json.loads(text, parse_constant=lambda c: pytest.fail(f"non-JSON constant {c}"))
    assert data["settings"] == {"size": "quick", "seed": 3}
    assert {"python", "numpy", "normlab"} <= set(data["versions"])
    good = data["experiments"]["good"]
    assert good["seed"] == 3 and good["sizes"] == {"n": 3} and good["elapsed_s"] >= 0
    check = good["checks"][0]
    assert check["claim"] == "the claim | with a pipe" and check["passed"] is True
    assert check["values"] == {"value": 1.02, "arr": [0, 1, 2], "inf": "inf"}
    assert good["metrics"] == {"value": 1.5, "nan": "nan"}


def test_progress_bars_run_without_error(tmp_path, capsys, monkeypatch):
    import normlab.lab.progress as progress

    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: True)  # as on a terminal
    outcomes = run_experiments(["good"], Settings(), loader=FAKES.__getitem__, show_progress=True)
    assert outcomes[0].status == "pass"
    assert "normlab report" in capsys.readouterr().err
    monkeypatch.setattr(progress, "stderr_is_terminal", lambda: False)  # a log file or a pipe
    run_experiments(["good"], Settings(), loader=FAKES.__getitem__, show_progress=True)
    assert capsys.readouterr().err == ""


def test_jsonable_and_markdown_helpers():
    assert jsonable({"a": np.int64(2), "b": (np.float32(0.5), -np.inf)}) == {
        "a": 2,
        "b": [0.5, "-inf"],
    }
    html = to_html("# T\n\npara with `a<b` and **bold**\n\n- item\n\n```\nx < y\n```")
    assert "<h1>T</h1>" in html and "<code>a&lt;b</code>" in html
    assert "<strong>bold</strong>" in html and "<li>item</li>" in html
    assert "<pre>x &lt; y</pre>" in html


def test_null_progress_is_a_progress():
    p = NullProgress()
    p.start(3, "x")
    p.advance(2)


def test_traceback_is_folded_and_reproduce_lines_carry_the_flags(tmp_path):
    _, _, files = run_report(["boom", "good"], Settings("quick", 2), tmp_path,
                             loader=FAKES.__getitem__)
    md = files.markdown.read_text()
    assert "`normlab report --quick --seed 2`" in md
    assert "`normlab run good --quick --seed 2`" in md
    # the traceback sits inside <details>, its last line as the summary
    folded = md.split("<details>", 1)[1].split("</details>", 1)[0]
    assert "<summary>RuntimeError: boom inside the fake experiment (traceback)</summary>" in folded
    assert "Traceback (most recent call last)" in folded
    page = files.html.read_text()
    assert "<details>\n<summary>RuntimeError: boom inside the fake experiment" in page
    assert re.search(r"<details>.*Traceback.*</details>", page, flags=re.S)
    # the summary table links each row to its section
    assert "[Fake good](#good)" in md and '<a href="#boom">Fake boom</a>' in page


def test_not_reproduced_is_its_own_status_with_exit_zero_and_detects_are_listed(tmp_path):
    def run(settings: Settings, progress: object) -> ExperimentResult:
        checks = [Check("P", "holds", "x > 0", "1", True),
                  Check("P", "a paper claim", "y > 0", "-1", False, if_false="NOT REPRODUCED")]
        return ExperimentResult("nr", "Honest", settings.seed, "", checks=checks)

    module = types.SimpleNamespace(NAME="nr", TITLE="Honest", run=run,
                                   DETECTS=("a break | with a pipe",))
    status, outcomes, files = run_report(["nr"], Settings(), tmp_path, loader=lambda _: module)
    assert outcomes[0].status == "not reproduced" and status == 0
    assert outcomes[0].detects == ("a break | with a pipe",)
    md = files.markdown.read_text()
    assert "| NOT REPRODUCED |" in md and "- a break \\| with a pipe" in md
    assert '<span class="notrep">NOT REPRODUCED</span>' in files.html.read_text()
    # a real FAIL next to it still wins
    checks = [Check("P", "c", "k", "m", False, if_false="NOT REPRODUCED"),
              Check("P", "c", "k", "m", False)]
    assert ExperimentResult("x", "X", 0, "", checks=checks).verdict == "FAIL"


def test_inconclusive_is_its_own_status_counted_apart_with_exit_zero(tmp_path, monkeypatch,
                                                                   capsys):
    def run(settings: Settings, progress: object) -> ExperimentResult:
        checks = [Check("P", "holds", "x > 0", "1", True),
                  Check("P", "too small to tell", "effect > SDE 0.05", "0.01", False,
                        if_false="INCONCLUSIVE")]
        return ExperimentResult("inc", "Unresolved", settings.seed, "", checks=checks)

    module = types.SimpleNamespace(NAME="inc", TITLE="Unresolved", run=run, DETECTS=())
    status, outcomes, files = run_report(["inc"], Settings(), tmp_path, loader=lambda _: module)
    assert outcomes[0].status == "inconclusive" and status == 0
    md = files.markdown.read_text()
    assert "| INCONCLUSIVE |" in md and "0 of 1 experiments passed**, 1 inconclusive" in md
    assert '<span class="inconc">INCONCLUSIVE</span>' in files.html.read_text()
    data = json.loads(files.metrics.read_text())
    assert data["experiments"]["inc"]["status"] == "inconclusive" and data["passed"] is True
    # precedence: a FAIL beside it wins, and so does a measured NOT REPRODUCED
    inc = Check("P", "c", "k", "m", False, if_false="INCONCLUSIVE")
    for other, word in ((Check("P", "c", "k", "m", False), "FAIL"),
                        (Check("P", "c", "k", "m", False, if_false="NOT REPRODUCED"),
                         "NOT REPRODUCED"), (Check("P", "c", "k", "m", True), "INCONCLUSIVE")):
        assert ExperimentResult("x", "X", 0, "", checks=[inc, other]).verdict == word
    # the terminal summary counts it apart
    from normlab import cli
    from normlab.lab import report

    real = report.run_experiments
    monkeypatch.setattr(report, "run_experiments", lambda names, settings, **kw: real(
        names, settings, **{**kw, "loader": lambda _: module}))
    monkeypatch.setattr(cli, "_selection", lambda only: ["inc"])
    assert cli.main(["report", "--quick", "--out", str(tmp_path / "r"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert "INCONCLUSIVE" in out and "0 of 1 experiments passed, 1 inconclusive" in out


def test_a_missing_optional_dependency_is_skipped_not_failed(tmp_path):
    def run(settings: Settings, progress: object) -> ExperimentResult:
        raise ExperimentSkipped('needs PyTorch: pip install ".[torch]"')

    module = types.SimpleNamespace(NAME="opt", TITLE="Optional", run=run)
    good = FAKES["good"]
    status, outcomes, files = run_report(
        ["opt", "good"], Settings(), tmp_path, loader={"opt": module, "good": good}.__getitem__
    )
    assert [o.status for o in outcomes] == ["skipped", "pass"] and status == 0
    assert outcomes[0].error == 'needs PyTorch: pip install ".[torch]"'
    md = files.markdown.read_text()
    assert "**SKIPPED**" in md and 'pip install ".[torch]"' in md
    # a skip never hides a failure beside it
    bad = run_experiments(["bad"], Settings(), loader=FAKES.__getitem__)
    assert exit_status([*outcomes, *bad]) == 1
