"""Release hygiene: one version source, the license metadata, and a smoke install of the wheel.

The smoke test follows CONTRIBUTING.md's release checklist: build the sdist and the wheel,
``twine check`` them, install the wheel into a fresh virtual environment and run the
``normlab`` command from there. To stay within about a minute it (a) builds without build
isolation and makes the venv with ``--system-site-packages`` (numpy, numba, ml_dtypes,
matplotlib and tqdm come from the running interpreter, normlab itself only from the wheel,
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
    _run([sys.executable, "-m", "venv", "--without-pip", "--system-site-packages", str(venv)])
    python = venv / "bin" / "python"
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
