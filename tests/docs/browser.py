"""Headless Chromium for the docs tests: find it, serve a built site, print a page's final DOM.

Not a conftest.py (see docs_build.py). A test that needs the browser calls `chromium_or_skip`,
which skips only when Chromium is not installed (`.ci/run` installs it with apt).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import json
import re
import shutil
import subprocess
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--hide-scrollbars",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--enable-logging=stderr", "--v=0", "--dump-dom",
]  # fmt: skip


def chromium() -> str | None:
    """The Chromium executable, or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


def chromium_or_skip() -> str:
    """The Chromium executable; skips the test when there is none."""
    found = chromium()
    if found is None:
        pytest.skip("Chromium is not installed and .ci/run could not install it (apt-get)")
    return found


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # no line per request
        pass


@contextlib.contextmanager
def serve(folder: Path) -> Iterator[str]:
    """Serve `folder` on 127.0.0.1 for the block; yields the base URL."""
    handler = functools.partial(_QuietHandler, directory=str(folder))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def dump_dom(url: str, *, virtual_time_ms: int = 10_000, timeout: int = 300) -> tuple[str, str]:
    """Load `url` in headless Chromium; the final DOM (stdout) and the browser's log."""
    with tempfile.TemporaryDirectory() as profile:
        done = subprocess.run(
            [chromium_or_skip(), *FLAGS, f"--virtual-time-budget={virtual_time_ms}",
             f"--user-data-dir={profile}", url],
            capture_output=True, text=True, timeout=timeout,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


def result_of(dom: str, element_id: str, log: str = "") -> dict:
    """The JSON a probe script wrote into `<pre id=element_id>` of the final DOM."""
    match = re.search(rf'<pre id="{element_id}">(.*?)</pre>', dom, re.S)
    assert match, f"the page never finished its check: {log[-3000:]}"
    text = match.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")
    result: dict = json.loads(text)
    return result
