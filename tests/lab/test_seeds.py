"""normlab seeds: reports at several seeds in parallel processes, and the page from metrics."""

from __future__ import annotations

import json
from pathlib import Path

from normlab.lab import seeds
from normlab.lab.tables import parse_tables


def _metrics(status: dict[str, str], wall: float = 10.0) -> dict:
    return {"total_elapsed_s": wall, "total_cpu_s": wall / 2,
            "machine": {"cpu": "test cpu"},
            "experiments": {n: {"status": s} for n, s in status.items()}}


def _write(out: Path, size: str, seed: int, metrics: dict) -> None:
    folder = out / size / f"seed-{seed}"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(metrics), encoding="utf-8")


def test_page_tabulates_each_seed_and_names_the_unstable_experiments(tmp_path):
    _write(tmp_path, "quick", 0, _metrics({"xiong_init": "pass", "norm_speed": "pass"}))
    _write(tmp_path, "quick", 1, _metrics({"xiong_init": "pass", "norm_speed": "inconclusive"}))
    _write(tmp_path, "default", 3, _metrics({"xiong_init": "not reproduced"}, wall=99.0))
    text = seeds.page(seeds.read_metrics(tmp_path), "normlab seeds --render-only")
    quick, default = parse_tables(text)[:2]
    assert quick[0] == ["quick", "seed 0", "seed 1"]
    assert quick[1] == ["xiong_init", "PASS", "PASS"]
    assert quick[2] == ["norm_speed", "PASS", "INC"]
    assert quick[3] == ["wall / CPU s", "10 / 5", "10 / 5"]
    assert default[1] == ["xiong_init", "NR"] and default[2] == ["wall / CPU s", "99 / 50"]
    assert "Same verdict at every seed: 1 of 2; differs: norm_speed" in text
    assert "## How to read an interval" in text


def test_runs_write_one_report_per_seed_and_the_page(tmp_path, capsys):
    # two real reports of one fast experiment, two at a time, one thread each
    out = tmp_path / "runs"
    page = tmp_path / "seeds.md"
    rc = seeds.main(["--seeds", "0,1", "--sizes", "quick", "--jobs", "2", "--threads", "1",
                     "--only", "dropout_stats", "--out", str(out), "--page", str(page)])
    assert rc == 0, capsys.readouterr()
    found = seeds.read_metrics(out)
    assert sorted(found["quick"]) == [0, 1]
    assert [found["quick"][s]["settings"]["seed"] for s in (0, 1)] == [0, 1]
    (table,) = parse_tables(page.read_text(encoding="utf-8"))[:1]
    assert table[1][0] == "dropout_stats" and table[1][1:] == ["PASS", "PASS"]
    # rendering again from the files alone gives the same page
    assert seeds.main(["--render-only", "--out", str(out), "--page", str(page)]) == 0


def test_bad_arguments_name_what_is_allowed(capsys):
    import pytest

    with pytest.raises(SystemExit):
        seeds.main(["--sizes", "huge"])
    assert "--sizes must name quick, default, full" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        seeds.main(["--seeds", "a-b"])
    assert "expected numbers and ranges" in capsys.readouterr().err


def test_the_normlab_command_forwards_every_argument_to_seeds(tmp_path):
    from normlab.cli import main

    _write(tmp_path, "quick", 4, _metrics({"invariance": "pass"}))
    page = tmp_path / "page.md"
    assert main(["seeds", "--render-only", "--out", str(tmp_path), "--page", str(page)]) == 0
    assert parse_tables(page.read_text(encoding="utf-8"))[0][1] == ["invariance", "PASS"]
