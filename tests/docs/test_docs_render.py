"""Every page of the built site reads as written, on a desk and on a phone.

Reads every HTML page of the strict build (`site_audit.py` does the reading) and fails on:

* raw reST that reached a page as text: roles (`:func:`...), directives (`.. math::`),
  double-backtick literals;
* rows of the docstring tables (Parameters, Returns, Raises, Attributes) with an empty
  Description: the docstring's prose landed in the Type column, or there was none;
* API entries shown as a bare name, without any text;
* pages wider than a 390 px phone screen, and names in table cells broken mid-word
  (measured in headless Chromium: every page in a 390 px frame);
* lab pages without the verdict of the committed report (`docs/lab/report/metrics.json`).

Each check is first shown to catch a deliberately broken page. The failure message lists
the counts per page and the first offenders, so it says what to fix (CONTRIBUTING.md,
"Docstrings").
"""

from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from browser import dump_dom, result_of, serve
from docs_build import build_site
from site_audit import bare_names, empty_descriptions, raw_rest

from normlab.lab.experiments import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "docs" / "_hooks"))
import lab_pages  # noqa: E402

PHONE = 390  # CSS px: the width of a common phone screen (iPhone 12 to 15)


@pytest.fixture(scope="module")
def site() -> Path:
    return build_site()


def _pages(site: Path) -> list[Path]:
    return sorted(p for p in site.rglob("*.html") if "check" not in p.name)


def _per_page(site: Path, find: Callable[[str], list[str]]) -> dict[str, list[str]]:
    found = {}
    for page in _pages(site):
        hits = find(page.read_text(encoding="utf-8"))
        if hits:
            found[str(page.relative_to(site))] = hits
    return found


def _report(found: dict[str, list[str]]) -> str:
    total = sum(len(v) for v in found.values())
    lines = [f"{total} on {len(found)} page(s):"]
    lines += [f"  {page}: {len(hits)}, e.g. {hits[:3]}" for page, hits in found.items()]
    return "\n".join(lines)


BROKEN = """
<div class="doc doc-object doc-function">
<h2 id="pkg.f" class="doc doc-heading"><span>f</span></h2>
<div class="doc-signature highlight"><pre><code>f(x)</code></pre></div>
<div class="doc doc-contents first">
<p>Calls :func:<code>g</code> and shows ``x``.</p>
<p>.. math:: y = x</p>
<table><tbody>
<tr class="doc-section-item"><td><code>x</code></td><td><code>float array of shape (N,).</code></td>
<td><div class="doc-md-description">
</div></td></tr>
</tbody></table>
</div></div>
<div class="doc doc-object doc-attribute">
<h3 id="pkg.CONSTANT" class="doc doc-heading"><span>CONSTANT</span></h3>
<div class="doc doc-contents ">
</div></div>
<pre><code>:func:`inside a code block is fine`</code></pre>
"""


def test_the_reading_catches_a_broken_page():
    assert len(raw_rest(BROKEN)) == 3  # the role, the directive, the double backticks
    assert empty_descriptions(BROKEN) == ["x | float array of shape (N,)."]
    assert bare_names(BROKEN) == ["pkg.CONSTANT"]
    fixed = BROKEN.replace(":func:<code>g</code>", '<a href="#g"><code>g</code></a>')
    assert len(raw_rest(fixed)) == 2


def test_no_raw_rest_on_any_page(site: Path):
    found = _per_page(site, raw_rest)
    assert not found, "raw reST roles, directives or ``literals`` shown as text: " + _report(
        found
    )


def test_no_empty_description_in_a_parameter_table(site: Path):
    found = _per_page(site, empty_descriptions)
    assert not found, "docstring table rows without a description: " + _report(found)


def test_no_api_entry_is_a_bare_name(site: Path):
    found = _per_page(site, bare_names)
    assert not found, "API entries without any text: " + _report(found)


# --- a phone's screen, in Chromium --------------------------------------------------------

WIDTH_PROBE = """
(async function () {
  var pages = window.__pages, width = window.__width, results = {};
  function describe(e) {
    var s = e.tagName.toLowerCase();
    if (e.id) s += "#" + e.id;
    if (typeof e.className === "string" && e.className.trim())
      s += "." + e.className.trim().split(/\\s+/).join(".");
    return s;
  }
  function scrolls(e, view) {  // inside a box that scrolls or clips sideways
    for (var a = e.parentElement; a; a = a.parentElement) {
      var ox = view.getComputedStyle(a).overflowX;
      if (ox === "auto" || ox === "scroll" || ox === "hidden" || ox === "clip") return true;
    }
    return false;
  }
  for (var i = 0; i < pages.length; i++) {
    var frame = document.createElement("iframe");
    frame.style.width = width + "px"; frame.style.height = "844px"; frame.style.border = "0";
    await new Promise(function (done) {
      frame.onload = done; frame.src = pages[i]; document.body.appendChild(frame);
    });
    await new Promise(function (done) { setTimeout(done, 200); });
    var doc = frame.contentDocument, view = frame.contentWindow, root = doc.documentElement;
    var wide = [], broken = [];
    var scroll = Math.max(root.scrollWidth, doc.body.scrollWidth);
    if (scroll > root.clientWidth) {
      doc.body.querySelectorAll("*").forEach(function (e) {
        var r = e.getBoundingClientRect();
        if (r.width > 0 && r.right > root.clientWidth + 0.5 && !scrolls(e, view) &&
            e.parentElement.getBoundingClientRect().right <= root.clientWidth + 0.5)
          wide.push(describe(e) + " to x=" + Math.round(r.right));
      });
    }
    doc.querySelectorAll("td code").forEach(function (e) {
      if (/^[\\w.]+$/.test(e.textContent) && e.getClientRects().length > 1)
        broken.push(e.textContent);
    });
    results[pages[i]] = {viewport: root.clientWidth, scroll: scroll, wide: wide.slice(0, 5),
                         broken: broken};
    frame.remove();
  }
  var out = document.createElement("pre");
  out.id = "normlab-width-check";
  out.textContent = JSON.stringify(results);
  document.body.appendChild(out);
})();
"""

WIDE_PAGE = """<!doctype html><html><head><meta name="viewport" content="width=device-width">
</head><body><p>text</p><div style="width: 900px">a 900 px box</div>
<table style="width: 300px"><tr><td>
<code style="word-break: break-all">a_long_experiment_name</code></td>
<td style="width: 260px">the theme's old rule broke names like this</td></tr>
</table></body></html>"""


@pytest.fixture(scope="module")
def phone_widths(site: Path) -> dict[str, dict]:
    """Every page (and one deliberately wide page) measured in a 390 px wide frame."""
    pages = [str(p.relative_to(site)) for p in _pages(site)]
    (site / "width-check-wide.html").write_text(WIDE_PAGE, encoding="utf-8")
    driver = site / "width-check.html"
    driver.write_text(
        "<!doctype html><html><body><script>"
        f"window.__pages = {json.dumps(['width-check-wide.html', *pages])};"
        f"window.__width = {PHONE};</script><script>{WIDTH_PROBE}</script></body></html>",
        encoding="utf-8",
    )
    try:
        with serve(site) as url:
            dom, log = dump_dom(f"{url}/width-check.html", virtual_time_ms=600_000, timeout=600)
    finally:
        driver.unlink()
        (site / "width-check-wide.html").unlink()
    return result_of(dom, "normlab-width-check", log)


def test_the_phone_probe_catches_a_wide_page_and_a_broken_name(phone_widths):
    wide = phone_widths.pop("width-check-wide.html")
    assert wide["viewport"] == PHONE and wide["scroll"] > PHONE
    assert any("900" in w or "div" in w for w in wide["wide"]), wide
    assert wide["broken"] == ["a_long_experiment_name"]


def test_no_page_is_wider_than_a_phone(phone_widths):
    phone_widths.pop("width-check-wide.html", None)
    assert len(phone_widths) > 30
    assert all(r["viewport"] == PHONE for r in phone_widths.values())
    wide = {page: r for page, r in phone_widths.items() if r["scroll"] > r["viewport"]}
    assert not wide, "pages wider than a 390 px phone screen: " + "\n".join(
        f"  {page}: {r['scroll']} px, from {r['wide']}" for page, r in wide.items()
    )


def test_no_name_in_a_table_breaks_mid_word(phone_widths):
    phone_widths.pop("width-check-wide.html", None)
    broken = {page: r["broken"] for page, r in phone_widths.items() if r["broken"]}
    assert not broken, f"names broken across lines at 390 px: {broken}"


# --- the lab ------------------------------------------------------------------------------


def _verdict_on(page_html: str) -> str | None:
    match = re.search(r'class="nl-verdict[^"]*">Verdict: <strong>([^<]+)</strong>', page_html)
    return match.group(1) if match else None


def test_the_verdict_reading_catches_a_page_without_one():
    assert _verdict_on('<p class="nl-verdict nl-verdict-pass">Verdict: <strong>PASS</strong>')
    assert _verdict_on("<p>PASS</p><h2>Claims</h2>") is None


def test_every_lab_page_shows_the_verdict_of_the_committed_report(site: Path):
    report = lab_pages.load_report()
    missing = {}
    for name in EXPERIMENTS:
        page = (site / "lab" / f"{name}.html").read_text(encoding="utf-8")
        entry = report["experiments"].get(name)
        shown = _verdict_on(page)
        if entry is None or shown != lab_pages.verdict(entry):
            missing[name] = shown
    assert not missing, (
        f"lab pages without the committed report's verdict: {missing}; regenerate it with "
        f"`{lab_pages.REGENERATE}`"
    )
