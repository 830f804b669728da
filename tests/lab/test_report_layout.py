"""The HTML report does not scroll sideways on a 390 px wide phone screen.

Rendered by headless Chromium when it is installed (skipped otherwise: the layout cannot be
measured without a browser). The page under test holds what makes pages wide: a table of
many long cells, a long unbroken word, a long code span, a traceback and a figure. The
report is loaded into a 390 px iframe and every element outside a table's scroll box or a
code block must end inside the viewport; the same probe on a page without the report's
wrappers shows the probe can fail.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import types
from pathlib import Path

import pytest

from normlab.lab.plotting import new_figure
from normlab.lab.report import run_report
from normlab.lab.result import Check, ExperimentResult, Settings
from normlab.lab.tables import markdown_table

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

_FRAME = """<!DOCTYPE html><html><body style="margin:0">
<iframe id="f" src="{src}" style="width:390px;height:844px;border:0"></iframe>
<script>
document.getElementById('f').addEventListener('load', function () {{
  var w = this.contentWindow, d = w.document, wide = 0;
  d.querySelectorAll('body *').forEach(function (el) {{
    var r = el.getBoundingClientRect();
    if (r.right > w.innerWidth + 0.5 && !el.closest('.table-wrap') && !el.closest('pre'))
      wide += 1;
  }});
  document.body.setAttribute('data-probe', d.documentElement.scrollWidth + ' '
                             + w.innerWidth + ' ' + wide);
}});
</script></body></html>"""


def _wide_module() -> types.SimpleNamespace:
    def run(settings: Settings, progress: object) -> ExperimentResult:
        fig, ax = new_figure(1, 2)
        ax[0].plot([0, 1], [0, 1])
        long = "supercalifragilistic" * 6
        table = markdown_table([f"column {i} with a long title" for i in range(9)],
                               [[f"{long[:30]} {j}" for j in range(9)]])
        check = Check("Paper 2099", f"a claim with {long}", "`" + "x" * 120 + "`", "1", True)
        return ExperimentResult("wide", "Wide", 0, f"Summary {long}.", [check],
                                figures={"f": fig}, tables=[table])

    return types.SimpleNamespace(NAME="wide", TITLE="Wide " + "t" * 80, run=run)


def _boom() -> types.SimpleNamespace:
    def run(settings: Settings, progress: object) -> ExperimentResult:
        raise RuntimeError("x" * 300)

    return types.SimpleNamespace(NAME="boom", TITLE="Boom", run=run)


def _probe(page: Path, tmp_path: Path) -> tuple[int, int, int]:
    frame = tmp_path / f"frame-{page.stem}.html"
    frame.write_text(_FRAME.format(src=page.name), encoding="utf-8")
    proc = subprocess.run(
        [str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu",
         "--allow-file-access-from-files", "--window-size=800,900",
         "--virtual-time-budget=5000", "--dump-dom", frame.as_uri()],
        capture_output=True, text=True, timeout=120, check=False,
    )
    found = re.search(r'data-probe="(\d+) (\d+) (\d+)"', proc.stdout)
    assert found, proc.stderr[-2000:]
    scroll, width, wide = (int(v) for v in found.groups())
    return scroll, width, wide


@pytest.mark.skipif(CHROMIUM is None, reason="headless Chromium is not installed")
def test_report_fits_a_390px_screen(tmp_path):
    modules = {"wide": _wide_module(), "boom": _boom()}
    _, _, files = run_report(["wide", "boom"], Settings(), tmp_path, loader=modules.__getitem__)
    scroll, width, wide = _probe(files.html, tmp_path)
    assert width == 390 and scroll <= width and wide == 0
    # the probe can fail: the same page without the wrappers and the CSS scrolls sideways
    bare = tmp_path / "bare.html"
    text = files.html.read_text(encoding="utf-8")
    text = re.sub(r"<style>.*?</style>", "", text, flags=re.S).replace('class="table-wrap"', "")
    bare.write_text(text, encoding="utf-8")
    scroll, width, wide = _probe(bare, tmp_path)
    assert scroll > width and wide > 0
