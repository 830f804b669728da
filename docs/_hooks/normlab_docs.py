"""Build hooks of the documentation site (mkdocs `hooks:`), so generated pages stay true.

* Math: `pymdownx.arithmatex` (generic mode) marks `$...$` and `$$...$$`; after
  markdown, each formula is rendered to MathML here with `latex2mathml` (pure Python), so
  pages need no JavaScript, no font download and no internet. A display formula sits in a
  box of its own that scrolls sideways on a narrow screen (`docs/stylesheets/normlab.css`).
* The lab: one page per experiment of `normlab.lab.experiments.EXPERIMENTS`, made from the
  committed report `docs/lab/report/metrics.json` (verdict, seed, time, machine, every
  claim with its source, criterion and measurement, the figures), plus an index that is
  the README's lab table (`lab_pages.py`).
* Exercises 16.1-16.4: the chapter's question, then the text `normlab exercise 16.x`
  prints, computed now.
* API reference: one page per public module (`::: module` directives, so every name in
  each `__all__` appears without editing the page).
* Conventions: the README's "Conventions" section, so the table lives in one place.
* Changelog: `CHANGELOG.md` itself.
* `{{ bits VALUE FORMAT }}` in a page becomes the `bit_layout` diagram, computed now.
* Pages written by other parts of the project (`torch.md`, `production.md`, the
  checkpoint example) join the navigation when their files exist.
"""

from __future__ import annotations

import ast
import html
import importlib
import re
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "src") not in sys.path:  # document the tree being built, not another install
    sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import lab_pages  # noqa: E402  (the lab's pages and the README's table: one source)

API_MODULES = {  # page -> (title, modules rendered on it)
    "api/core.md": ("normlab (functional core)", ["normlab", "normlab.gradcheck"]),
    "api/nn.md": ("normlab.nn", ["normlab.nn"]),
    "api/optim.md": ("normlab.nn.optim", ["normlab.nn.optim"]),
    "api/precision.md": ("normlab.precision", ["normlab.precision"]),
    "api/torch.md": ("normlab.torch", ["normlab.torch"]),
    "api/kernels.md": ("normlab.kernels", ["normlab.kernels", "normlab.bench"]),
    "api/lab.md": (
        "normlab.lab",
        [
            "normlab.lab.experiments",
            "normlab.lab.result",
            "normlab.lab.replicates",
            "normlab.lab.seeds",
            "normlab.lab.runner",
            "normlab.lab.report",
            "normlab.lab.render",
            "normlab.lab.plotting",
            "normlab.lab.progress",
            "normlab.lab.training",
            "normlab.lab.exercises",
        ],
    ),
    "api/cli.md": ("normlab.cli (the command line)", ["normlab.cli"]),
}

OPTIONAL_PAGES = {  # nav title -> file under docs/, listed only when it exists
    "normlab inside PyTorch": "torch.md",
}


SRC = ROOT / "src"


def _module_file(module: str) -> Path:
    """The source file of a normlab module (found without importing it)."""
    base = SRC.joinpath(*module.split("."))
    return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")


def _exists(module: str) -> bool:
    return _module_file(module).is_file()


def _public_modules() -> list[str]:
    """normlab and its public submodules, read from the source tree in `pkgutil` order.

    Nothing is imported: a module that needs an optional extra (torch) is listed and
    documented whether or not the extra is installed, so the site is the same either way
    and `pip install ".[docs]"` is all the build needs.
    """

    def walk(package: Path, name: str) -> list[str]:
        found = [name]
        for entry in sorted(package.iterdir(), key=lambda p: p.stem):
            child = f"{name}.{entry.stem}"
            if entry.name.startswith("_"):
                continue
            if entry.is_dir() and (entry / "__init__.py").is_file():
                found += walk(entry, child)
            elif entry.suffix == ".py":
                found.append(child)
        return found

    return walk(SRC / "normlab", "normlab")


def _static_all(module: str) -> list[str]:
    """A module's `__all__`, read from its source: `__all__ = [...]`, then any `+= [...]` or
    `+= other.__all__` (`other` a module imported by name), or `from other import __all__`
    (a re-export of another module's names)."""
    names: list[str] = []
    modules: dict[str, str] = {}  # local name -> the module it names
    for node in ast.parse(_module_file(module).read_text(encoding="utf-8")).body:
        if isinstance(node, ast.ImportFrom) and node.module is not None:
            for a in node.names:
                if _exists(f"{node.module}.{a.name}"):
                    modules[a.asname or a.name] = f"{node.module}.{a.name}"
            if any(a.name == "__all__" and a.asname is None for a in node.names):
                names = _static_all(node.module)
        elif isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
        ):
            names = list(ast.literal_eval(node.value))
        elif (isinstance(node, ast.AugAssign) and isinstance(node.target, ast.Name)
              and node.target.id == "__all__"):
            value = node.value
            if (isinstance(value, ast.Attribute) and value.attr == "__all__"
                    and isinstance(value.value, ast.Name) and value.value.id in modules):
                names += _static_all(modules[value.value.id])
            else:
                names += list(ast.literal_eval(value))
    return names


def _other_names() -> dict[str, list[str]]:
    """Names in a module's ``__all__`` that no page above renders (helpers of submodules).

    A name counts as rendered when a module shown on an API page (or an experiment's lab
    page) that contains this module lists it in its own ``__all__`` and no submodule of that
    module has the same name (griffe would show the
    submodule, e.g. ``normlab.torch.training.convert``).
    """
    shown = [m for _, modules in API_MODULES.values() for m in modules if _exists(m)]
    shown += [f"normlab.lab.experiments.{name}" for name in _experiments()]
    other: dict[str, list[str]] = {}
    for name in _public_modules():
        if name in shown:
            continue
        covering = [  # a name that is also a submodule's name renders as the submodule
            {n for n in _static_all(m) if not _exists(f"{m}.{n}")}
            for m in shown
            if name == m or name.startswith(m + ".")
        ]
        left = [n for n in _static_all(name) if not any(n in c for c in covering)]
        if left:
            other[name] = left
    return other


def _api_pages() -> dict[str, tuple[str, list[str]]]:
    pages = {
        page: (title, [m for m in modules if _exists(m)])
        for page, (title, modules) in API_MODULES.items()
        if any(_exists(m) for m in modules)
    }
    if _other_names():
        pages["api/other.md"] = ("Other public names", list(_other_names()))
    return pages


def _experiments() -> dict[str, str]:
    from normlab.lab.experiments import EXPERIMENTS

    return dict(EXPERIMENTS)


def _expand_nav(nav: list[Any]) -> list[Any]:
    """Replace the GENERATED placeholders of mkdocs.yml's nav and add the optional pages."""
    out: list[Any] = []
    for item in nav:
        if not isinstance(item, dict):
            out.append(item)
            continue
        (title, value), = item.items()
        if value == "GENERATED:api":
            value = [{t: page} for page, (t, _) in _api_pages().items()]
        elif value == "GENERATED:lab":
            value = [{"Overview": "lab/index.md"}, {"Seed table": "lab/seeds.md"}]
            value += [{name: f"lab/{name}.md"} for name in _experiments()]
        elif value == "GENERATED:optional":
            for optional_title, page in OPTIONAL_PAGES.items():
                if (ROOT / "docs" / page).is_file():
                    out.append({optional_title: page})
            continue
        elif isinstance(value, list):
            value = _expand_nav(value)
        if value:
            out.append({title: value})
    return out


def on_config(config: Any) -> Any:
    config["nav"] = _expand_nav(config["nav"])
    how_to = next(v for i in config["nav"] for k, v in i.items() if k == "How-to guides")
    if (ROOT / "examples" / "checkpoint_resume.py").is_file():
        how_to.append({"Checkpoint and resume": "howto/checkpoint.md"})
    return config


# --- generated pages -----------------------------------------------------------------------


def _api_page(title: str, modules: list[str]) -> str:
    parts = [f"# {title}\n"]
    other = _other_names() if title == "Other public names" else {}
    if other:
        parts.append(
            "Helpers that submodules export but their packages do not re-export; import "
            "them from the module named in each heading.\n"
        )
    for module in modules:
        parts.append(f"::: {module}\n")
        if module in other:
            listed = ", ".join(other[module])
            parts.append(f"    options:\n      members: [{listed}]\n")
    return "\n".join(parts)


def _lab_figures(name: str) -> list[str]:
    """The committed figures of experiment `name`, relative to its page (lab/NAME.html)."""
    folder = lab_pages.REPORT / "figures"
    return [f"report/figures/{p.name}" for p in sorted(folder.glob(f"{name}-*.png"))]


def _lab_page(name: str, description: str, report: dict[str, Any]) -> str:
    module = importlib.import_module(f"normlab.lab.experiments.{name}")
    detects = tuple(str(d) for d in getattr(module, "DETECTS", ()))
    return lab_pages.lab_page(
        name, description, str(getattr(module, "TITLE", description)), detects, report,
        _lab_figures(name),
    )


def _exercises() -> str:
    from normlab.lab.exercises import QUESTIONS, exercise_text

    lines = [
        "# Exercises 16.1-16.4\n",
        "The chapter's exercises, solved with normlab: each states the chapter's question, "
        "then what `normlab exercise 16.x` prints. The output was computed when this site was "
        "built, so the numbers are the library's, not copied.\n",
    ]
    for number, (title, question) in QUESTIONS.items():
        lines += [f"## Exercise {number} {title}\n", "!!! question \"The question\"\n"]
        lines += [f"    {question}\n"]
        lines += ["```console", f"$ normlab exercise {number}", exercise_text(number), "```", ""]
    return "\n".join(lines)


def _changelog() -> str:
    """CHANGELOG.md as a page: the file itself, so the page is never a copy."""
    return (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")


def _conventions() -> str:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    match = re.search(r"^## Conventions\n(.*?)(?=^## |\Z)", readme, re.M | re.S)
    if match is None:
        raise ValueError("README.md has no '## Conventions' section to show")
    return "# Conventions\n\n" + match.group(1).strip() + "\n"


def on_files(files: Any, config: Any) -> Any:
    from mkdocs.structure.files import File

    generated = {page: _api_page(t, m) for page, (t, m) in _api_pages().items()}
    experiments = _experiments()
    report = lab_pages.load_report()
    generated["lab/index.md"] = lab_pages.lab_index(report, experiments)
    for name, text in experiments.items():
        generated[f"lab/{name}.md"] = _lab_page(name, text, report)
    generated["exercises.md"] = _exercises()
    generated["conventions.md"] = _conventions()
    generated["changelog.md"] = _changelog()
    if (ROOT / "examples" / "checkpoint_resume.py").is_file():
        generated["howto/checkpoint.md"] = (
            "# Checkpoint and resume\n\nThe whole script (`examples/checkpoint_resume.py`, run "
            "by the test suite):\n\n```python\n--8<-- \"examples/checkpoint_resume.py\"\n```\n"
        )
    for path, content in generated.items():
        files.append(File.generated(config, path, content=content))
    return files


# --- markdown and html passes --------------------------------------------------------------

_BITS = re.compile(r"\{\{ bits (\S+) (\S+) \}\}")


def _bits(match: re.Match[str]) -> str:
    from normlab.precision import bit_layout

    value, fmt = match.group(1), match.group(2)
    return f"```text\n$ normlab bits {value} --format {fmt}\n{bit_layout(float(value), fmt)}\n```"


def on_page_markdown(markdown: str, page: Any, config: Any, files: Any) -> str:
    if "{{ report_time }}" in markdown:  # the one measured time the pages quote
        markdown = markdown.replace(
            "{{ report_time }}", lab_pages.report_time(lab_pages.load_report())
        )
    return _BITS.sub(_bits, markdown)


_INLINE = re.compile(r'<span class="arithmatex">\\\((.*?)\\\)</span>', re.S)
_BLOCK = re.compile(r'<div class="arithmatex">\\\[(.*?)\\\]</div>', re.S)


def _mathml(tex: str, display: str) -> str:
    from latex2mathml.converter import convert

    mathml = convert(html.unescape(tex).strip(), display=display)
    if display == "block":  # a box of its own, which scrolls sideways on a narrow screen
        return f'<div class="nl-math" tabindex="0">{mathml}</div>'
    return mathml


def on_page_content(html_text: str, page: Any, config: Any, files: Any) -> str:
    html_text = _BLOCK.sub(lambda m: _mathml(m.group(1), "block"), html_text)
    return _INLINE.sub(lambda m: _mathml(m.group(1), "inline"), html_text)
