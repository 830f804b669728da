"""Open the built site in a real browser: headless Chromium, from a local static server.

Loads the home page, one API page and one lab page; on each, no console message (errors,
uncaught exceptions, failed resource loads all log one), no failed resource load, and every
image loaded with a non-zero size. A copy of each page gets a small script at the top of its
head that records errors from the start and writes the result into the page once it has
loaded; Chromium prints the final DOM (``--dump-dom``).

Skips only when Chromium is not installed and cannot be (``.ci/run`` installs it with apt).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from browser import dump_dom, result_of, serve
from docs_build import build_site

PAGES = ["index.html", "api/precision.html", "lab/xiong_init.html"]

PROBE = """<script>
window.__normlabErrors = [];
window.addEventListener("error", function (e) {
  var t = e.target;
  window.__normlabErrors.push(t && t !== window ? "failed to load " + (t.src || t.href)
                                                 : "uncaught " + e.message);
}, true);
window.addEventListener("unhandledrejection", function (e) {
  window.__normlabErrors.push("unhandled rejection " + e.reason);
});
["error", "warn"].forEach(function (level) {
  var original = console[level];
  console[level] = function () {
    window.__normlabErrors.push(level + ": " + Array.prototype.join.call(arguments, " "));
    return original.apply(console, arguments);
  };
});
window.addEventListener("load", function () {
  setTimeout(function () {
    var images = Array.prototype.map.call(document.images, function (img) {
      return {src: img.getAttribute("src"), ok: img.complete && img.naturalWidth > 0};
    });
    var out = document.createElement("pre");
    out.id = "normlab-browser-check";
    out.textContent = JSON.stringify({errors: window.__normlabErrors, images: images});
    document.body.appendChild(out);
  }, 500);
});
</script>"""



@pytest.fixture(scope="module")
def site() -> Path:
    return build_site()


@pytest.fixture(scope="module")
def server(site: Path) -> Iterator[str]:
    with serve(site) as url:
        yield url


def test_probe_reports_a_broken_image(site: Path, server: str):
    # the check itself must be able to fail: a page with a missing image and a thrown error
    bad = site / "broken-check.html"
    bad.write_text(
        f"<html><head>{PROBE}</head><body><img src='figures/missing.png'>"
        "<script>throw new Error('boom')</script></body></html>",
        encoding="utf-8",
    )
    try:
        result, console = _open(server, "broken-check.html")
    finally:
        bad.unlink()
    assert any("missing.png" in e for e in result["errors"])
    assert any("boom" in e for e in result["errors"]) and "boom" in console
    assert result["images"] == [{"src": "figures/missing.png", "ok": False}]


def _open(server: str, relpath: str) -> tuple[dict, str]:
    dom, log = dump_dom(f"{server}/{relpath}")
    result = result_of(dom, "normlab-browser-check", log)
    console = "\n".join(line for line in log.splitlines() if ":CONSOLE" in line)
    return result, console


@pytest.mark.parametrize("page", PAGES)
def test_page_loads_cleanly_in_chromium(site: Path, server: str, page: str):
    original = (site / page).read_text(encoding="utf-8")
    probe_copy = (site / page).with_name(f"browser-check-{Path(page).name}")
    probe_copy.write_text(original.replace("<head>", "<head>" + PROBE, 1), encoding="utf-8")
    try:
        result, console = _open(server, str(probe_copy.relative_to(site)))
    finally:
        probe_copy.unlink()
    assert result["errors"] == [], result["errors"]
    assert console == "", console
    assert all(image["ok"] for image in result["images"]), result["images"]
    if page != "api/precision.html":  # the home and lab pages show figures
        assert result["images"], f"{page} should show a figure"
