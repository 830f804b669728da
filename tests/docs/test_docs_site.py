"""The documentation site: a strict build, offline pages, every public name, generated pages.

The site is built once per session into a temporary folder with ``mkdocs build --strict``
(any warning, broken cross-reference or missing page fails it). Needs the ``docs`` extra
(part of the ``test`` extra).
"""

from __future__ import annotations

import html
import importlib
import pkgutil
import re
from pathlib import Path

import pytest
from docs_build import build_site

import normlab
from normlab.lab.exercises import QUESTIONS, exercise_text
from normlab.lab.experiments import EXPERIMENTS

ROOT = Path(__file__).resolve().parents[2]

EXTERNAL = re.compile(
    r"""<script[^>]*\ssrc=["']?(?:https?:)?//"""
    r"""|<link[^>]*\shref=["']?(?:https?:)?//"""
    r"""|<(?:img|iframe|source|video|audio)[^>]*\ssrc=["']?(?:https?:)?//"""
    r"""|@import\s+(?:url\()?["']?(?:https?:)?//"""
    r"""|url\(["']?(?:https?:)?//""",
    re.I,
)



@pytest.fixture(scope="module")
def site() -> Path:
    return build_site()

def _text(page: str) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page))


def _public_modules() -> list[str]:
    names = ["normlab"]
    for info in pkgutil.walk_packages(normlab.__path__, "normlab."):
        if not any(part.startswith("_") for part in info.name.split(".")):
            names.append(info.name)
    return names


def test_external_resource_pattern_catches_a_cdn():
    assert EXTERNAL.search('<script src="https://cdn.example/katex.min.js"></script>')
    assert EXTERNAL.search("<link rel=stylesheet href=//fonts.example/css>")
    assert EXTERNAL.search("@import url('https://fonts.example/x.css');")
    assert not EXTERNAL.search('<a href="https://arxiv.org/abs/1607.06450">paper</a>')
    assert not EXTERNAL.search('<script src="assets/javascripts/bundle.js"></script>')


def test_no_page_loads_anything_from_the_internet(site: Path):
    offenders = []
    for path in site.rglob("*"):
        if path.suffix in {".html", ".css"}:
            match = EXTERNAL.search(path.read_text(encoding="utf-8", errors="replace"))
            if match:
                offenders.append(f"{path.relative_to(site)}: {match.group(0)}")
    assert not offenders, offenders


def test_every_public_name_is_on_some_page(site: Path):
    ids: set[str] = set()
    for page in site.rglob("*.html"):
        ids.update(re.findall(r'\sid="([^"]+)"', page.read_text(encoding="utf-8")))
    missing = []
    for module_name in _public_modules():
        module = importlib.import_module(module_name)
        for name in getattr(module, "__all__", ()):
            if f"{module_name}.{name}" not in ids and not any(i.endswith(f".{name}") for i in ids):
                missing.append(f"{module_name}.{name}")
    assert not missing, missing


def test_equations_are_mathml_and_link_to_their_functions(site: Path):
    norm = (site / "concepts" / "normalization.html").read_text(encoding="utf-8")
    residual = (site / "concepts" / "residuals.html").read_text(encoding="utf-8")
    for number, anchor, page in [
        ("16.1", "normlab.layer_norm_forward", norm),
        ("16.2", "normlab.rms_norm_forward", norm),
        ("16.3", "normlab.layer_norm_backward", norm),
        ("16.4", "normlab.nn.Residual", residual),
    ]:
        assert f"<mtext>({number})</mtext>" in page, number
        assert re.search(rf'href="[^"]*#{re.escape(anchor)}"', page), anchor
    for page in site.rglob("*.html"):
        text = page.read_text(encoding="utf-8")
        assert 'class="arithmatex"' not in text, f"unrendered math in {page}"


def test_lab_pages_follow_the_registry(site: Path):
    # what each page shows is checked against the committed report in test_lab_pages.py
    for name in EXPERIMENTS:
        page = (site / "lab" / f"{name}.html").read_text(encoding="utf-8")
        assert f"normlab run {name}" in _text(page)
    index = _text((site / "lab" / "index.html").read_text(encoding="utf-8"))
    assert all(name in index for name in EXPERIMENTS)


def test_exercise_page_states_each_question_and_shows_what_the_command_prints(site: Path):
    text = _text((site / "exercises.html").read_text(encoding="utf-8"))
    for number, (title, question) in QUESTIONS.items():
        assert f"Exercise {number} {title}" in text
        prose = question.split("$")[0].split()  # up to the first formula (MathML on the page)
        assert " ".join(prose[:8]) in " ".join(text.split()), number
        assert f"$ normlab exercise {number}" in text
        for line in exercise_text(number).splitlines():
            assert line.strip() in text, line


def test_changelog_page_is_the_changelog(site: Path):
    text = " ".join(_text((site / "changelog.html").read_text(encoding="utf-8")).split())
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    headings = re.findall(r"^#+ (.+)$", changelog, re.M)
    assert headings and all(h.strip() in text for h in headings)
    first_item = re.search(r"^- (.{20,60}?)[`*\[]", changelog, re.M)
    assert first_item is None or re.sub(r"[*`]", "", first_item.group(1)).strip() in text


def test_conventions_page_is_the_readme_table(site: Path):
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    section = readme.split("## Conventions", 1)[1].split("\n## ", 1)[0]
    rows = [r for r in section.splitlines() if r.startswith("| ") and "---" not in r]
    assert rows
    text = _text((site / "conventions.html").read_text(encoding="utf-8"))
    for row in rows:
        first_cell = row.split("|")[1].strip().replace("`", "")
        assert first_cell in text, first_cell


def test_nav_lists_every_page_and_the_generated_ones(site: Path):
    nav = (site / "index.html").read_text(encoding="utf-8")
    for page in ["getting-started.html", "exercises.html", "conventions.html", "api/core.html",
                 "api/precision.html", "lab/index.html", "production.html",
                 "changelog.html"]:  # fmt: skip
        assert f'href="{page}"' in nav, page
    for optional in ("torch.md",):  # another part of the project writes these pages
        if (ROOT / "docs" / optional).is_file():
            assert f'href="{optional.replace(".md", ".html")}"' in nav, optional


def _doc_pages() -> list[Path]:
    """The Markdown pages under docs/ (not a locally written report in docs/lab/report/)."""
    report = ROOT / "docs" / "lab" / "report"
    return sorted(p for p in (ROOT / "docs").rglob("*.md") if report not in p.parents)


@pytest.mark.parametrize("page", [str(p.relative_to(ROOT / "docs")) for p in _doc_pages()])
def test_python_blocks_in_pages_run(page, tmp_path, monkeypatch):
    # every ```python (or ```py) block of a page is a complete program that runs alone
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "docs" / page).read_text(encoding="utf-8")
    for i, block in enumerate(re.findall(r"```py(?:thon)?\n(.*?)```", text, re.S)):
        if "--8<--" in block:  # an included example script: run by test_examples
            continue
        exec(compile(block, f"{page} block {i}", "exec"), {"__name__": "docs_block"})


def test_python_blocks_in_the_readme_run(tmp_path, monkeypatch):
    # as the pages' blocks: each ```python block of README.md is a complete program
    monkeypatch.chdir(tmp_path)
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```py(?:thon)?\n(.*?)```", text, re.S)
    assert len(blocks) >= 2
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md block {i}", "exec"), {"__name__": "readme_block"})


def test_readme_links_and_images_point_at_files():
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    targets = re.findall(r"\]\(((?!https?://|#)[^)\s]+)\)", text)
    assert targets
    missing = [t for t in targets if not (ROOT / t.split("#")[0]).exists()]
    assert not missing, missing


def test_install_lines_say_where_to_run_them():
    # `pip install ".[...]"` needs the source tree: each page that gives one says so first
    for path in [ROOT / "README.md", *_doc_pages()]:
        text = path.read_text(encoding="utf-8")
        first = re.search(r'pip install (?:-e )?"?\.', text)
        if first is None:
            continue
        before = text[: first.start()]
        assert re.search(r"clone|source tree|root folder", before), path.name


EXIT_WORDING = "0 unless an experiment FAILs or raises an exception, then 1"


def test_the_exit_status_is_worded_the_same_everywhere():
    # what normlab.lab.runner.exit_status does, in one wording: README, getting started and
    # the command's own docstring; no page says anything else about the report's exit status
    from normlab import cli

    sources = {
        "README.md": (ROOT / "README.md").read_text(encoding="utf-8"),
        "getting-started.md": (ROOT / "docs" / "getting-started.md").read_text(encoding="utf-8"),
        "normlab.cli": cli.__doc__ or "",
    }
    for name, text in sources.items():
        assert EXIT_WORDING in " ".join(text.split()), name
    for path in [ROOT / "README.md", *_doc_pages()]:
        flat = " ".join(path.read_text(encoding="utf-8").split())
        for wrong in ("exits 1 when a claim is not reproduced", "exits non-zero",
                      "experiments passed"):  # fmt: skip
            assert wrong not in flat, (path.name, wrong)
