"""Release hygiene: one version source, the license metadata, and a smoke install of the wheel.

The smoke test follows CONTRIBUTING.md's release checklist: build the sdist and the wheel,
``twine check`` them, install the wheel into a fresh virtual environment and run the
``normlab`` command from there. To stay within about a minute it (a) builds without build
isolation and lets the venv import the running interpreter's packages through a ``.pth``
file (numpy, numba, ml_dtypes, matplotlib and tqdm come from wherever this interpreter has
them: a venv, a conda-like prefix or a system install; normlab itself only from the wheel,
which the test checks), and (b) runs ``normlab report --quick`` on the four fastest
experiments; the full ``normlab report --quick`` is the checklist's manual step.
"""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import normlab

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser, vendored by pip
    from pip._vendor import tomli as tomllib  # type: ignore[no-redef]

ROOT = Path(__file__).resolve().parents[1]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
FAST_EXPERIMENTS = "invariance,batch_vs_layer,dropout_stats,fp8_formats"


def test_one_version_source():
    project = PYPROJECT["project"]
    assert "version" not in project and "version" in project["dynamic"]
    attr = PYPROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "normlab.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+((a|b|rc)\d+)?", normlab.__version__)
    changelog = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8")
    released = re.findall(r"^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d\d-\d\d$", changelog, re.M)
    assert normlab.__version__ in released  # a dated entry for the current version
    assert changelog.index("## [Unreleased]") < changelog.index(f"## [{released[0]}]")


def test_license_metadata_and_file():
    project = PYPROJECT["project"]
    assert project["license"] == "MIT" and project["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert text.startswith("MIT License") and "Copyright (c) 2026 the normlab authors" in text
    assert not any(c.startswith("License ::") for c in project["classifiers"])  # PEP 639
    assert project["requires-python"].startswith(">=")


def test_no_message_points_at_a_missing_install_source():
    # normlab is installed from its source tree: 'pip install "normlab[...]"' would fail
    hits = [
        str(p.relative_to(ROOT))
        for folder in ("src", "docs", "examples")
        if (ROOT / folder).is_dir()
        for p in (ROOT / folder).rglob("*")
        if p.suffix in {".py", ".md"} and re.search(r"install [\"']?normlab\[", p.read_text())
    ]
    assert not hits, hits


def _run(args: list[str], **kwargs) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=180, **kwargs)
    assert done.returncode == 0, f"{args}\n{done.stdout}\n{done.stderr}"
    return done


def _dependency_dirs() -> list[str]:
    """The running interpreter's package folders (a venv's, a conda prefix's or the system's).

    Not the base interpreter's: inside a virtual environment ``--system-site-packages``
    would expose those, which need not hold numpy, ml_dtypes or numba. Only folders named
    site-packages or dist-packages: an editable install of this source tree puts ``src/``
    on the path too, and normlab must come from the wheel alone.
    """
    return [p for p in dict.fromkeys(sys.path)
            if Path(p).name in ("site-packages", "dist-packages") and Path(p).is_dir()]


def _share_dependencies(python: Path) -> None:
    """Let the smoke environment import what the running interpreter has installed.

    A ``.pth`` file of plain paths in the venv's own site-packages: they follow it on
    ``sys.path``, so the wheel installed into the venv comes first; ``.pth`` files inside
    those folders are not run (no editable install of the source tree leaks in).
    """
    probe = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    own = Path(_run([str(python), "-I", "-c", probe]).stdout.strip())  # the venv's own
    (own / "_normlab_smoke_deps.pth").write_text("\n".join(_dependency_dirs()) + "\n")


def test_smoke_environment_sees_the_running_interpreters_packages(tmp_path):
    # numpy, ml_dtypes and numba must come from wherever this interpreter found them
    # (a venv, a conda-like prefix or a system install), never from the source tree
    _run([sys.executable, "-m", "venv", "--without-pip", str(tmp_path / "venv")])
    python = tmp_path / "venv" / "bin" / "python"
    _share_dependencies(python)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    probe = ("import ml_dtypes, numba, numpy, sys; "
             "print(all(m.__file__.startswith(tuple(sys.argv[1:])) for m in "
             "(ml_dtypes, numba, numpy)))")
    done = _run([str(python), "-c", probe, *_dependency_dirs()], cwd=tmp_path, env=env)
    assert done.stdout.strip() == "True"
    missing = _run([str(python), "-c", "import importlib.util as u; "
                    "print(u.find_spec('normlab'))"], cwd=tmp_path, env=env)
    assert missing.stdout.strip() == "None"  # normlab itself: only from the wheel


@pytest.mark.slow
def test_wheel_and_sdist_build_check_and_smoke_install(tmp_path):
    for module in ("build", "twine"):
        if importlib.util.find_spec(module) is None:
            pytest.fail(f"{module} is missing: pip install -e '.[test]' installs it")
    dist = tmp_path / "dist"
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", str(dist), str(ROOT)])
    (wheel,) = dist.glob("normlab-*.whl")
    (sdist,) = dist.glob("normlab-*.tar.gz")
    assert wheel.name.startswith(f"normlab-{normlab.__version__}-")
    _run([sys.executable, "-m", "twine", "check", "--strict", str(wheel), str(sdist)])
    with zipfile.ZipFile(wheel) as zf:
        info = f"normlab-{normlab.__version__}.dist-info"
        metadata = zf.read(f"{info}/METADATA").decode()
        assert "License-Expression: MIT" in metadata
        assert f"{info}/licenses/LICENSE" in zf.namelist()

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)])
    python = venv / "bin" / "python"
    _share_dependencies(python)
    work = tmp_path / "work"  # not the source tree: nothing may come from there
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    install = [str(python), "-m", "pip", "install", "-q", "--no-deps", "--no-index"]
    # --force-reinstall: an installed normlab outside the venv must not stand in for the wheel
    _run([*install, "--force-reinstall", str(wheel)], cwd=work, env=env)
    where = _run([str(python), "-c", "import normlab; print(normlab.__file__)"], cwd=work, env=env)
    assert Path(where.stdout.strip()).is_relative_to(venv)
    normlab_cmd = str(venv / "bin" / "normlab")
    version = _run([normlab_cmd, "--version"], cwd=work, env=env)
    assert version.stdout.strip() == f"normlab {normlab.__version__}"
    report = _run(
        [normlab_cmd, "report", "--quick", "--only", FAST_EXPERIMENTS, "--out", "rep"],
        cwd=work, env=env,
    )  # fmt: skip
    assert "4 PASS · 0 FAIL" in report.stdout
    assert (work / "rep" / "report.html").is_file() and (work / "rep" / "metrics.json").is_file()


def test_ci_runs_every_readme_quick_start_line_in_a_fresh_environment():
    # .ci/run takes every line of the README's quick-start block, as written, cheap ones
    # first (docs, report, tests), and runs each in a virtual environment it has just made
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    quick = readme.split("## Quick start", 1)[1].split("```", 2)[1]
    written = [ln for ln in quick.splitlines()[1:] if ln.strip()]  # after the "bash" tag
    lines = [ln for ln in written if re.match(r"pip install .*&& python -m pytest", ln)]
    assert len(lines) == 1, quick
    listed = subprocess.run(["bash", str(ROOT / ".ci" / "run"), "--list"], capture_output=True,
                            text=True, timeout=60, check=True).stdout.splitlines()
    assert sorted(listed) == sorted(written)  # every line, exactly as written
    order = [next(i for i, key in enumerate(("mkdocs", "normlab report", "pytest")) if key in ln)
             for ln in listed]
    assert order == sorted(order), listed  # docs build, then the report, then the tests
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert re.search(r'python3 -m venv "\$tmp/venv\$i" && \. "\$tmp/venv\$i/bin/activate" '
                     r'&& eval "\$line"', ci)  # a new venv for each line
    assert "exit 1" in ci.split('eval "$line"', 1)[1]  # a failing line fails the run
