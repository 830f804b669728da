"""The normlab command: parsing, every subcommand's output and exit status."""

from __future__ import annotations

import json
import subprocess
import sys
import types

import pytest

from normlab.cli import UsageError, build_parser, main
from normlab.lab._deps import require
from normlab.lab.experiments import EXPERIMENTS, UnknownExperimentError, resolve


def test_parser_defaults_and_sizes():
    parser = build_parser()
    args = parser.parse_args(["report"])
    assert (args.size, args.seed, args.out, args.only) == ("default", 0, "normlab-report", None)
    args = parser.parse_args(["report", "--quick", "--seed", "5", "--only", "a,b", "--out", "x"])
    assert (args.size, args.seed, args.only, args.out) == ("quick", 5, "a,b", "x")
    assert parser.parse_args(["run", "invariance", "--full"]).size == "full"
    with pytest.raises(UsageError):
        parser.parse_args(["report", "--quick", "--full"])  # mutually exclusive
    with pytest.raises(UsageError):
        parser.parse_args(["exercise", "16.9"])
    with pytest.raises(UsageError):
        parser.parse_args([])


def test_resolve_orders_names_and_lists_known_ones_on_error():
    assert resolve(None) == list(EXPERIMENTS)
    assert resolve("dropout_stats, xiong-init") == ["xiong_init", "dropout_stats"]
    with pytest.raises(UnknownExperimentError, match="known experiments: xiong_init"):
        resolve("xiong_init,nope")


def test_unknown_experiment_exits_2_with_the_known_names(capsys):
    assert main(["run", "nope", "--no-progress"]) == 2
    err = capsys.readouterr().err
    assert "nope" in err and all(name in err for name in EXPERIMENTS)
    assert main(["report", "--only", "bogus", "--no-progress"]) == 2


def test_list_prints_every_experiment_in_order(capsys):
    assert main(["list"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split()[1] for line in lines] == list(EXPERIMENTS)


def test_run_writes_a_report_and_exits_zero(tmp_path, capsys):
    out = tmp_path / "inv"
    assert main(["run", "invariance", "--quick", "--out", str(out), "--no-progress"]) == 0
    assert "PASS" in capsys.readouterr().out
    data = json.loads((out / "metrics.json").read_text())
    assert list(data["experiments"]) == ["invariance"] and data["passed"] is True
    assert (out / "report.html").is_file() and (out / "figures" / "invariance-table.png").is_file()


def test_report_only_runs_the_selection(tmp_path, capsys):
    args = ["report", "--quick", "--seed", "2", "--only", "dropout_stats,invariance"]
    assert main([*args, "--out", str(tmp_path), "--no-progress"]) == 0
    data = json.loads((tmp_path / "metrics.json").read_text())
    assert list(data["experiments"]) == ["invariance", "dropout_stats"]  # report order
    assert data["settings"] == {"size": "quick", "seed": 2}
    assert "2 PASS · 0 FAIL" in capsys.readouterr().out


def test_formats_prints_the_table(capsys):
    assert main(["formats"]) == 0
    out = capsys.readouterr().out
    assert "bfloat16" in out and "float8_e4m3fn" in out and "65504" in out


def test_bits_prints_the_layout(capsys):
    assert main(["bits", "1.5", "--format", "bf16"]) == 0
    out = capsys.readouterr().out
    # 1.5 = 0 01111111 1000000 in bfloat16 (hand-derived: exponent 127, mantissa 64/128)
    assert "0x3fc0" in out.lower()
    assert main(["bits", "1.5", "--format", "nosuchformat"]) == 2
    assert "nosuchformat" in capsys.readouterr().err


def test_bench_hands_its_arguments_to_normlab_bench(monkeypatch):
    seen: list[list[str]] = []
    fake = types.ModuleType("normlab.bench")
    fake.main = lambda argv=None: seen.append(list(argv)) or 3  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "normlab.bench", fake)
    import normlab

    monkeypatch.setattr(normlab, "bench", fake, raising=False)
    assert main(["bench", "--sizes", "64x64", "--help-me"]) == 3
    assert seen == [["--sizes", "64x64", "--help-me"]]


@pytest.mark.parametrize("number", ["16.1", "16.2", "16.3", "16.4"])
def test_exercise_prints_its_demonstration(number, capsys):
    assert main(["exercise", number]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"Exercise {number}")
    assert len(out.splitlines()) >= 6


def test_missing_lab_dependency_names_the_extra():
    with pytest.raises(ImportError, match=r"pip install matplotlib tqdm threadpoolctl .*\.\[lab\]"):
        require("normlab_no_such_plotting_library")


def test_library_imports_no_plotting_or_progress_library():
    code = (
        "import sys, normlab, normlab.nn, normlab.precision, normlab.cli\n"
        "bad = [m for m in ('matplotlib', 'tqdm') if m in sys.modules]\n"
        "assert not bad, bad\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_module_entry_point():
    done = subprocess.run(
        [sys.executable, "-m", "normlab", "list"], capture_output=True, text=True, check=True
    )
    assert "xiong_init" in done.stdout


def test_bench_reaches_the_real_benchmark_module(capsys):
    # --help makes normlab.bench's own parser print its usage and exit 0: proof that the
    # arguments went through untouched (`normlab` itself has no --json option)
    with pytest.raises(SystemExit) as stop:
        main(["bench", "--help"])
    assert stop.value.code == 0
    assert "--json" in capsys.readouterr().out
