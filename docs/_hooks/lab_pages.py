"""The lab's pages and the README's lab table, made from one committed report.

The committed report is `docs/lab/report/` (`metrics.json` and `figures/*.png`), written by

    normlab report --out docs/lab/report

(its `report.md` and `report.html` stay out of git and out of the site). From its
`metrics.json` this module makes, at every site build:

* one page per experiment: the verdict, the seed, the size, the time and the machine, each
  claim with its source, criterion, measured value and verdict, the figures, the breaks the
  experiment detects;
* the lab index, which is the README's lab table (`lab_table`), so the two cannot disagree.

`python docs/_hooks/lab_pages.py` rewrites the table between the README's
`<!-- lab-table -->` markers after a new report; `--check` only says whether it is current
(`tests/docs/test_lab_pages.py` runs the same comparison).
"""

from __future__ import annotations

import html
import json
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
REPORT = ROOT / "docs" / "lab" / "report"
README = ROOT / "README.md"
REGENERATE = "normlab report --out docs/lab/report"
START, END = "<!-- lab-table:start -->", "<!-- lab-table:end -->"
TIME_START, TIME_END = "<!-- report-time:start -->", "<!-- report-time:end -->"

__all__ = [
    "check_verdict",
    "lab_index",
    "lab_page",
    "lab_table",
    "load_report",
    "readme_with_table",
    "report_time",
    "verdict",
]


def load_report(folder: Path = REPORT) -> dict[str, Any]:
    """The committed report's `metrics.json`."""
    path = folder / "metrics.json"
    if not path.is_file():
        raise FileNotFoundError(f"no committed lab report at {path}; write it with: {REGENERATE}")
    report: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return report


def verdict(entry: Mapping[str, Any]) -> str:
    """An experiment's verdict as the report's terminal shows it: PASS, NOT REPRODUCED, ..."""
    return str(entry.get("verdict") or entry["status"]).upper()


def check_verdict(check: Mapping[str, Any]) -> str:
    """One check's verdict: the one the report wrote, else PASS or its `if_false`."""
    if check.get("verdict"):
        return str(check["verdict"]).upper()
    return "PASS" if check["passed"] else str(check.get("if_false", "FAIL")).upper()


def _cell(text: str) -> str:
    return " ".join(str(text).split()).replace("|", "\\|")


_CITED = re.compile(r"^(.*?\b(?:19|20)\d\d), (.+)$")  # "Xiong et al. 2020, Lemma 2"


def _sources(entry: Mapping[str, Any]) -> str:
    """The checks' sources, each once, one work's parts together.

    `"Xiong et al. 2020, Lemma 2"` and `"Xiong et al. 2020, Theorem 1"` give
    `"Xiong et al. 2020, Lemma 2; Theorem 1"`.
    """
    parts = dict.fromkeys(
        part.strip() for c in entry.get("checks", ()) for part in str(c["source"]).split("; ")
    )
    groups: dict[str, list[str]] = {}
    for part in parts:
        cited = _CITED.match(part)
        work, detail = (cited.group(1), cited.group(2)) if cited else (part, "")
        groups.setdefault(work, [])
        if detail:
            groups[work].append(detail)
    return "; ".join(f"{work}, {'; '.join(d)}" if d else work for work, d in groups.items())


def _verdict_cell(entry: Mapping[str, Any]) -> str:
    word = verdict(entry)
    others = [c for c in entry.get("checks", ()) if check_verdict(c) not in ("PASS", word)]
    notes = [c for c in entry.get("checks", ()) if check_verdict(c) == word != "PASS"]
    if word == "SKIPPED" and entry.get("error"):
        return f"SKIPPED: {_cell(str(entry['error']).strip().splitlines()[-1])}"
    if word == "ERROR":
        return "ERROR (see the experiment's page)"
    shown = (notes or others)[:1]
    if shown:
        measured = _cell(shown[0]["measured"]).removeprefix(f"{word}: ")
        return f"{word}: {measured}"
    return word


def lab_table(
    report: Mapping[str, Any],
    registry: Mapping[str, str],
    link: Callable[[str], str] = lambda name: f"`{name}`",
) -> str:
    """The lab table: one row per experiment of the registry, verdicts from the report.

    The "what is checked" cell is the experiment's entry of
    `normlab.lab.experiments._checked.CHECKED` (its set-up and claims), else its registry title.

    `link(name)` writes the experiment's cell (plain code in the README, a link to the
    experiment's page on the site); everything else is the same text in both places.
    """
    rows = [
        "| # | experiment | source | what is checked | verdict |",
        "|---|---|---|---|---|",
    ]
    runs = report.get("experiments", {})
    checked = _checked()
    for i, (name, title) in enumerate(registry.items(), 1):
        description = checked.get(name, title)
        entry = runs.get(name)
        if entry is None:
            rows.append(f"| {i} | {link(name)} | | {_cell(description)} | not in the report |")
            continue
        rows.append(
            f"| {i} | {link(name)} | {_cell(_sources(entry))} | {_cell(description)} | "
            f"{_verdict_cell(entry)} |"
        )
    return "\n".join(rows)


def _provenance(report: Mapping[str, Any]) -> str:
    settings = report.get("settings", {})
    machine = report.get("machine", {})
    where = (
        f"{machine.get('cpu', 'an unrecorded CPU')}, {machine.get('logical_cores', '?')} "
        "logical cores" if machine else "an unrecorded machine"
    )
    return (
        f"size `{settings.get('size', '?')}`, seed {settings.get('seed', '?')}, "
        f"{report.get('generated_utc', '?')}, {round(float(report.get('total_elapsed_s', 0)))} s "
        f"of wall time on {where}"
    )


def report_time(report: Mapping[str, Any]) -> str:
    """How long the committed report ran, and where: the one time the docs quote."""
    machine = report.get("machine") or {}
    cpu = machine.get("cpu", "an unrecorded CPU")
    cores = machine.get("logical_cores", "?")
    with_torch = report.get("experiments", {}).get("lowp_training", {}).get("status")
    torch_note = (
        f", `lowp_training` (which needs PyTorch) included: "
        f"{report['experiments']['lowp_training']['elapsed_s']:.0f} s of it"
        if with_torch not in (None, "skipped") else ""
    )
    return (
        f"{round(float(report.get('total_elapsed_s', 0)))} s of wall time{_cpu_note(report)} "
        f"for the committed report (size `{report.get('settings', {}).get('size', '?')}`"
        f"{torch_note}) on {cpu} with {cores} logical cores, {report.get('generated_utc', '?')}"
    )


def _cpu_note(report: Mapping[str, Any]) -> str:
    """CPU time and load, when the report has them: wall time alone depends on other work."""
    cpu_s = report.get("total_cpu_s")
    load = (report.get("machine") or {}).get("load_average_1min")
    parts = [f"{round(float(cpu_s))} s of CPU time"] if cpu_s is not None else []
    if load is not None:
        parts.append(f"load average {load} when it finished")
    return f" ({', '.join(parts)})" if parts else ""


def readme_block(report: Mapping[str, Any], registry: Mapping[str, str]) -> str:
    """What the README holds between its markers: where the verdicts come from, the table."""
    return (
        f"{START}\n"
        f"Verdicts of the committed report `docs/lab/report/metrics.json` "
        f"({_provenance(report)}); `{REGENERATE}` writes a new one, and "
        "`python docs/_hooks/lab_pages.py` copies its verdicts here.\n\n"
        f"{lab_table(report, registry)}\n"
        f"{END}"
    )


def readme_with_table(readme: str, report: Mapping[str, Any], registry: Mapping[str, str]) -> str:
    """`readme` with the text between the lab-table markers made from `report`."""
    pattern = re.compile(re.escape(START) + ".*?" + re.escape(END), re.S)
    if not pattern.search(readme):
        raise ValueError(f"README.md has no {START} ... {END} markers around the lab table")
    block = readme_block(report, registry)
    readme = pattern.sub(lambda _: block, readme, count=1)
    timing = re.compile(re.escape(TIME_START) + ".*?" + re.escape(TIME_END), re.S)
    return timing.sub(lambda _: f"{TIME_START}{report_time(report)}{TIME_END}", readme)


def lab_index(report: Mapping[str, Any], registry: Mapping[str, str]) -> str:
    """The site's lab overview: the README's table, each name linked to its page."""
    return (
        "# The lab\n\n"
        "Each experiment reproduces a claim of a paper the chapter cites and states the claim, "
        "the measured value and the pass criterion side by side. `normlab report` runs them "
        "all and writes `report.html`, `report.md`, `metrics.json` and the figures; "
        "`normlab run NAME` runs one. A verdict is PASS, FAIL (a mechanism the lab relies on "
        "is broken), NOT REPRODUCED (the lab works, and the paper's claim measurably does not "
        "hold at this scale) or SKIPPED (an optional dependency is missing).\n\n"
        f"The verdicts below are those of the committed report ({_provenance(report)}); "
        "the README shows the same table, made from the same `metrics.json`.\n\n"
        + lab_table(report, registry, link=lambda name: f"[`{name}`]({name}.md)")
        + "\n"
    )


def _verdict_box(word: str) -> str:
    slug = re.sub(r"[^a-z]+", "-", word.lower()).strip("-")
    word = html.escape(word)
    return f'<p class="nl-verdict nl-verdict-{slug}">Verdict: <strong>{word}</strong></p>'


def lab_page(
    name: str,
    description: str,
    module_title: str,
    detects: tuple[str, ...],
    report: Mapping[str, Any],
    figures: list[str],
) -> str:
    """One experiment's page, from its entry in the committed report.

    `figures` are the page-relative paths of its committed figures. Without an entry the
    page says so and shows no verdict (the site test then fails: regenerate the report).
    """
    entry = report.get("experiments", {}).get(name)
    title = entry.get("title", module_title) if entry else module_title
    lines = [f"# {title}\n", f"*{description}*\n"]
    if entry is None:
        lines.append(
            f"This experiment is not in the committed report; `{REGENERATE}` adds it.\n"
        )
    else:
        lines.append(_verdict_box(verdict(entry)) + "\n")
        sizes = entry.get("sizes") or {}
        size_text = ", ".join(f"{k} {v}" for k, v in sizes.items()) if sizes else ""
        lines.append(
            f"From the committed report: seed {entry.get('seed', report['settings']['seed'])}, "
            f"size `{report['settings']['size']}`"
            + (f" ({_cell(size_text)})" if size_text else "")
            + f". This experiment ran {entry['elapsed_s']:.1f} s of the whole report's "
            f"{report_time(report)}.\n"
        )
        if entry.get("error"):
            lines += ["```text", str(entry["error"]).strip(), "```", ""]
    lines.append(
        f"Run it: `normlab run {name}` (or `--quick`, `--full`, `--seed N`); source: "
        f"`src/normlab/lab/experiments/{name}.py`.\n"
    )
    if entry is not None and entry.get("checks"):
        lines.append("## Claims, criteria and measurements\n")
        for i, check in enumerate(entry["checks"], 1):
            lines += [
                f"### {i}. {_cell(check['source'])}\n",
                f"- **Claim:** {_cell(check['claim'])}",
                f"- **Criterion:** {_cell(check['criterion'])}",
                f"- **Measured:** {_cell(check['measured'])}",
                *_interval_line(check.get("interval")),
                f"- **Verdict:** {check_verdict(check)}",
                "",
            ]
    if figures:
        lines.append("## Figures\n")
        lines.append("From the committed report.\n")
        for fig in figures:
            stem = Path(fig).stem.removeprefix(f"{name}-").replace("_", " ")
            lines.append(f"![{name}: {stem}]({fig})\n")
    lines.append("## Breaks it detects\n")
    if detects:
        lines += [f"- {_cell(item).replace('``', '`')}" for item in detects] + [""]
    else:
        lines.append("This experiment does not declare its `DETECTS` yet.\n")
    lines.append("## The experiment's module\n")
    lines.append(
        f"::: normlab.lab.experiments.{name}\n"
        "    options:\n      show_root_heading: false\n      heading_level: 3\n"
    )
    return "\n".join(lines)


def _interval_line(iv: Mapping[str, Any] | None) -> list[str]:
    """The effect, its 95% interval, the replicates and what each is (none: exact check)."""
    if not iv:
        return ["- **Interval:** none (an exact check)"]
    kind = "mean" if iv["method"] == "t" else "median"
    return [f"- **Effect:** {_num(iv['estimate'])}, 95% interval [{_num(iv['low'])}, "
            f"{_num(iv['high'])}], {iv['n']} replicates ({kind} of: {_cell(iv['averaged'])})"]


def _num(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, (int, float)) else str(v)


def _checked() -> dict[str, str]:
    """Each experiment's "what is checked" cell (its set-up and claims), by name."""
    sys.path.insert(0, str(ROOT / "src"))
    from normlab.lab.experiments._checked import CHECKED

    return dict(CHECKED)


def _registry() -> dict[str, str]:
    sys.path.insert(0, str(ROOT / "src"))
    from normlab.lab.experiments import EXPERIMENTS

    return dict(EXPERIMENTS)


def main(argv: list[str]) -> int:
    """Rewrite the README's lab table from the committed report (`--check`: only compare)."""
    text = README.read_text(encoding="utf-8")
    new = readme_with_table(text, load_report(), _registry())
    if new == text:
        print("README.md's lab table matches docs/lab/report/metrics.json")
        return 0
    if "--check" in argv:
        print("README.md's lab table differs from docs/lab/report/metrics.json; run: "
              "python docs/_hooks/lab_pages.py")
        return 1
    README.write_text(new, encoding="utf-8")
    print("README.md: lab table rewritten from docs/lab/report/metrics.json")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
