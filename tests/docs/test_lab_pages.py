"""The lab's pages and the README's lab table come from one committed report.

`docs/lab/report/metrics.json` (written by `normlab report --out docs/lab/report`) is the
only source: the README's table must be what `docs/_hooks/lab_pages.py` makes from it (so a
new report without `python docs/_hooks/lab_pages.py` fails here), the site's lab index is the
same table, and every experiment's page shows each claim with its source, criterion,
measured value and verdict, the seed and the time.
"""

from __future__ import annotations

import html
import importlib
import re
import sys
from pathlib import Path

import pytest
from docs_build import build_site

from normlab.lab.experiments import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
import lab_pages  # noqa: E402


@pytest.fixture(scope="module")
def report() -> dict:
    return lab_pages.load_report()


@pytest.fixture(scope="module")
def site() -> Path:
    return build_site()


def _text(page: str) -> str:
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", page)).split())


def _flat(text: str) -> str:
    return " ".join(str(text).split())


def test_the_committed_report_covers_every_experiment(report):
    assert set(report["experiments"]) == set(EXPERIMENTS), (
        f"the committed report and the registry differ; run `{lab_pages.REGENERATE}`"
    )
    for name in EXPERIMENTS:
        figures = sorted((lab_pages.REPORT / "figures").glob(f"{name}-*.png"))
        assert figures or report["experiments"][name]["status"] in ("skipped", "error"), name


def test_readme_table_is_made_from_the_committed_report(report):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    expected = lab_pages.readme_with_table(readme, report, EXPERIMENTS)
    assert readme == expected, (
        "README.md's lab table is not the committed report's; run: python docs/_hooks/lab_pages.py"
    )


def test_the_table_follows_the_report_not_the_readme(report):
    # the comparison above can fail: another verdict in metrics.json gives another table
    changed = {**report, "experiments": {k: dict(v) for k, v in report["experiments"].items()}}
    first = next(iter(EXPERIMENTS))
    changed["experiments"][first]["status"] = "fail"
    before = lab_pages.lab_table(report, EXPERIMENTS)
    after = lab_pages.lab_table(changed, EXPERIMENTS)
    assert before != after and f"| 1 | `{first}` |" in after and "| FAIL" in after


def test_any_verdict_the_report_has_is_shown(report):
    name = next(iter(EXPERIMENTS))
    entry = dict(report["experiments"][name])
    entry["status"] = "inconclusive"  # a verdict this generator was not written for
    entry["checks"] = [
        {**c, "passed": False, "if_false": "INCONCLUSIVE"} for c in entry.get("checks", [])
    ]
    fake = {**report, "experiments": {name: entry}}
    page = lab_pages.lab_page(name, "desc", "title", (), fake, [])
    assert 'Verdict: <strong>INCONCLUSIVE</strong>' in page
    assert "| INCONCLUSIVE" in lab_pages.lab_table(fake, {name: "desc"})


def test_the_site_lab_index_is_the_readme_table(site: Path, report):
    index = _text((site / "lab" / "index.html").read_text(encoding="utf-8"))
    readme_rows = lab_pages.lab_table(report, EXPERIMENTS).splitlines()[2:]
    for row in readme_rows:
        cells = [c.strip().replace("`", "").replace("\\|", "|")
                 for c in row.strip("|").split(" | ")]
        for cell in cells:
            assert _flat(cell) in index, cell


def test_each_lab_page_shows_claims_criteria_measurements_seed_and_time(site: Path, report):
    for name in EXPERIMENTS:
        entry = report["experiments"][name]
        page = (site / "lab" / f"{name}.html").read_text(encoding="utf-8")
        text = _text(page)
        assert f"normlab run {name}" in text
        assert f"seed {entry.get('seed', report['settings']['seed'])}" in text, name
        assert f"ran {entry['elapsed_s']:.1f} s" in text, name
        for check in entry.get("checks", []):
            for field in ("source", "claim", "criterion", "measured"):
                assert _flat(check[field]) in text, (name, field, check[field])
            assert f"Verdict: {lab_pages.check_verdict(check)}" in text, name
        for figure in sorted((lab_pages.REPORT / "figures").glob(f"{name}-*.png")):
            assert f'src="report/figures/{figure.name}"' in page, figure.name
            assert (site / "lab" / "report" / "figures" / figure.name).is_file()
        module = importlib.import_module(f"normlab.lab.experiments.{name}")
        for item in getattr(module, "DETECTS", ()):
            assert _flat(str(item)).replace("``", "").split()[0] in text, item


def test_readme_without_markers_is_refused(report):
    with pytest.raises(ValueError, match="lab-table"):
        lab_pages.readme_with_table("# README\n", report, EXPERIMENTS)
