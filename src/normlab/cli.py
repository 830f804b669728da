"""The `normlab` command: the lab's report, single experiments, formats, bits, bench, exercises.

Subcommands::

    normlab report [--quick|--full] [--out DIR] [--seed N] [--only NAME,...]
    normlab run NAME [--quick|--full] [--out DIR] [--seed N]
    normlab list
    normlab formats
    normlab bits VALUE --format NAME [--rounding MODE] [--saturate]
                                            (negative values after --: bits --format e5m2 -- -1e-3)
    normlab bench [ARGS...]
    normlab inspect LOG.jsonl [--out DIR]
    normlab exercise 16.1|16.2|16.3|16.4
    normlab --version

Exit status: 0 unless an experiment FAILs or raises an exception, then 1 (PASS, NOT
REPRODUCED, INCONCLUSIVE and SKIPPED all exit 0); 2 for a usage error (unknown experiment,
bad value, unusable `--out`, a missing optional dependency), always found before any
experiment runs and reported in one line; 130 when interrupted (Ctrl-C); 141 when stdout
is a pipe that was closed early (nothing printed).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, NoReturn

__all__ = ["UsageError", "build_parser", "main"]

DEFAULT_OUT = "normlab-report"
"""The report folder of `normlab report` without `--out` (relative to the working folder)."""
EXERCISES = ("16.1", "16.2", "16.3", "16.4")
"""The chapter's exercises that `normlab exercise NUMBER` solves."""


class UsageError(Exception):
    """A mistake in the command line: printed as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors that say what to do, raised instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise UsageError(f"{message} (see `{self.prog} --help`)")


def _seed(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer in [0, 2**64), got {text!r}") from None
    if not 0 <= value < 2**64:  # every generator the experiments seed takes 64 bits
        raise argparse.ArgumentTypeError(f"expected an integer in [0, 2**64), got {value}")
    return value


def _add_size(p: argparse.ArgumentParser) -> None:
    group = p.add_mutually_exclusive_group()
    group.add_argument(
        "--quick", dest="size", action="store_const", const="quick", help="small sizes (< 1 min)"
    )
    group.add_argument(
        "--full", dest="size", action="store_const", const="full", help="larger sizes (slow)"
    )
    p.set_defaults(size="default")
    p.add_argument("--seed", type=_seed, default=0,
                   help="seed of every experiment, in [0, 2**64) (default 0)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def _version() -> str:
    from normlab import __version__

    return f"normlab {__version__}"


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of `normlab` (exposed for tests and documentation).

    Its errors raise [UsageError][normlab.cli.UsageError] (one line, what to do) instead of exiting;
    `--help` and `--version` print and exit 0 as usual.
    """
    from normlab.lab.experiments import EXPERIMENTS  # the registry only: no heavy import

    parser = _Parser(
        prog="normlab",
        description="normlab: normalization, residuals and precision, with a lab that "
        "reproduces the papers' claims.",
    )
    parser.add_argument("--version", action="version", version=_version())
    sub = parser.add_subparsers(
        dest="command", metavar="COMMAND", required=True, parser_class=_Parser
    )

    rep = sub.add_parser("report", help="run the experiments and write the report")
    _add_size(rep)
    rep.add_argument("--out", default=DEFAULT_OUT, help=f"output folder (default ./{DEFAULT_OUT}/)")
    rep.add_argument(
        "--only",
        default=None,
        metavar="NAME,...",
        help="comma-separated experiment names: " + ", ".join(EXPERIMENTS),
    )

    run = sub.add_parser("run", help="run one experiment and write its report")
    run.add_argument("name", help="experiment name: " + ", ".join(EXPERIMENTS))
    _add_size(run)
    run.add_argument("--out", default=None, help=f"output folder (default ./{DEFAULT_OUT}/NAME/)")

    sub.add_parser("list", help="list the experiments in report order")
    sub.add_parser("formats", help="print the table of float formats")

    _add_bits_parser(sub)

    bench = sub.add_parser("bench", help="benchmark the kernels and emulated training "
                           "(arguments go to normlab.bench)")
    bench.add_argument("args", nargs=argparse.REMAINDER, help="arguments for normlab.bench")

    insp = sub.add_parser("inspect", help="report on a numerics-inspector log "
                          "(normlab.torch.inspect): heatmaps, worst layers, a convert mapping")
    insp.add_argument("log", help="the JSON-lines file inspect(..., path=...) wrote")
    insp.add_argument("--out", default="normlab-inspect",
                      help="output folder (default ./normlab-inspect/)")
    seeds = sub.add_parser("seeds", help="run the report at several seeds and sizes and write "
                           "the seed table (arguments go to normlab.lab.seeds)")
    seeds.add_argument("args", nargs=argparse.REMAINDER, help="arguments for normlab.lab.seeds")

    ex = sub.add_parser("exercise", help="print the runnable solution of an exercise")
    ex.add_argument("number", choices=EXERCISES, help="exercise number")
    return parser


# --- formats and bits -----------------------------------------------------------------------

_DETERMINISTIC = ("nearest", "nearest_away", "toward_zero", "toward_positive",
                  "toward_negative")
_RECIPES = """Block-scaled recipes (normlab.precision):
  MX            mx_quantize          E8M0 scale per 32 elements; elements e4m3, e5m2,
                                     fp6_e3m2, fp6_e2m3, fp4 (E2M1) or int8 (MXINT8, k/64)
  NVFP4         nvfp4_quantize       E2M1 elements, E4M3 scale per 16 (or 16x16),
                                     one float32 scale per tensor
  blockwise FP8 blockwise_quantize   e4m3/e5m2, float32 scale per 1x128 or 128x128 block
  per-tensor    fp8_quantize, quantize_current_scaling, Fp8Meta (delayed scaling)"""


def _add_bits_parser(sub: Any) -> None:
    bits = sub.add_parser("bits", help="print the bit layout of a value in a format")
    bits.add_argument("value", type=float, help="the value, e.g. 3.14 or inf (negative: after --)")
    bits.add_argument("--format", required=True, dest="fmt", help="format name, e.g. bf16, e4m3")
    bits.add_argument("--rounding", default="nearest", choices=_DETERMINISTIC,
                      help="rounding mode (default nearest, ties to even)")
    bits.add_argument("--saturate", action="store_true",
                      help="overflow and infinities become +-max instead of inf/NaN")


def _formats() -> int:
    from normlab.precision import formats_table

    print(formats_table())
    print()
    print(_RECIPES)
    return 0


def _bits(args: argparse.Namespace) -> int:
    from normlab.precision import bit_layout, get_format

    print(bit_layout(args.value, get_format(args.fmt), rounding=args.rounding,
                     saturate=args.saturate))
    return 0


def _check_format(name: str) -> None:
    """Raise UsageError for a format name get_format does not know (before any work)."""
    from normlab.precision import get_format

    try:
        get_format(name)
    except ValueError as exc:
        raise UsageError(f"--format: {exc}") from None


# --- report and run ---------------------------------------------------------------------------


def _check_out(out: str) -> None:
    """Raise UsageError unless `out` can become a report folder (before any work)."""
    from normlab.lab.report import check_out_dir

    try:
        check_out_dir(out)
    except ValueError as exc:
        raise UsageError(f"--out: {exc}") from None


def _selection(only: str | None) -> list[str]:
    from normlab.lab.experiments import resolve

    if only is not None and not only.replace(",", "").strip():
        raise UsageError(
            f"--only: no experiment name in {only!r}; give names such as "
            "--only invariance,dropout_stats (see `normlab list`), or leave --only out to run all"
        )
    try:
        return resolve(only)
    except ValueError as exc:  # UnknownExperimentError
        raise UsageError(str(exc)) from None


def _report(names: Sequence[str], args: argparse.Namespace, out: str) -> int:
    from normlab.lab._deps import require

    for module in ("matplotlib", "tqdm"):  # fail early, with the install hint
        try:
            require(module)
        except ImportError as exc:
            raise UsageError(str(exc)) from None
    _check_out(out)

    from normlab.lab.report import run_report
    from normlab.lab.result import Settings

    settings = Settings(size=args.size, seed=args.seed)
    progress = not args.no_progress and sys.stderr.isatty()
    try:
        status, outcomes, files = run_report(names, settings, Path(out), show_progress=progress)
    except KeyboardInterrupt:
        print(f"normlab {args.command}: interrupted; {out} was not changed", file=sys.stderr)
        return 130
    for o in outcomes:
        n_ok = sum(c.passed for c in o.result.checks) if o.result is not None else 0
        n_all = len(o.result.checks) if o.result is not None else 0
        word = o.status.upper()  # PASS, FAIL, NOT REPRODUCED, SKIPPED, ERROR, ...
        print(f"{word:14s} {o.name:20s} {n_ok}/{n_all} checks  {o.elapsed_s:6.1f} s")
        if o.status in ("error", "skipped") and o.error:
            last = o.error.strip().splitlines()[-1]
            print(f"{'':15s}{last}")
    from normlab.lab.render import verdict_summary

    print(verdict_summary(outcomes))
    print(f"report: {files.markdown}, {files.html}")
    return status


def _inspect(log: str, out: str) -> int:
    from normlab.lab._deps import require

    try:
        require("matplotlib")
        from normlab.lab.inspect_report import run_inspect

        print(run_inspect(log, out))
    except (ImportError, ValueError) as exc:  # a malformed log (LogError) or a bad --out
        raise UsageError(str(exc)) from None
    return 0


def _dispatch(args: argparse.Namespace) -> int:
    if args.command == "report":
        return _report(_selection(args.only), args, args.out)
    if args.command == "run":
        (name,) = _selection(args.name)
        out = args.out if args.out is not None else str(Path(DEFAULT_OUT) / name)
        return _report([name], args, out)
    if args.command == "list":
        from normlab.lab.experiments import EXPERIMENTS

        for i, (name, text) in enumerate(EXPERIMENTS.items(), 1):
            print(f"{i}. {name:20s} {text}")
        return 0
    if args.command == "formats":
        return _formats()
    if args.command == "bits":
        _check_format(args.fmt)
        return _bits(args)
    if args.command == "bench":
        import importlib

        bench = importlib.import_module("normlab.bench")  # the benchmark package
        rest = [a for i, a in enumerate(args.args) if not (i == 0 and a == "--")]
        rc = bench.main(rest)
        return int(rc) if rc is not None else 0
    if args.command == "inspect":
        return _inspect(args.log, args.out)
    if args.command == "seeds":
        from normlab.lab.seeds import main as seeds_main

        return seeds_main([a for i, a in enumerate(args.args) if not (i == 0 and a == "--")])
    if args.command == "exercise":
        from normlab.lab.exercises import exercise_text

        print(exercise_text(args.number))
        return 0
    raise AssertionError(f"unhandled command {args.command!r}")  # argparse prevents this


def _negative_value_hint(argv: Sequence[str]) -> str:
    """A hint when a negative number was taken for an option (`bits -1e-3`)."""
    for arg in argv:
        if arg.startswith("-") and arg != "--":
            try:
                float(arg)
            except ValueError:
                continue
            return f"; negative values go after --, e.g. normlab bits --format e5m2 -- {arg}"
    return ""


def _quiet_broken_pipe() -> int:
    # the reader went away (`normlab formats | head -1`): say nothing, and keep Python's
    # final flush of stdout from printing a traceback
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 141  # 128 + SIGPIPE, what a shell reports for a process killed by a closed pipe


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the `normlab` command; returns the exit status.

    >>> main(["list"])  # doctest: +ELLIPSIS
    1. xiong_init ...
    0
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] in (["bench"], ["seeds"]):  # the rest belongs to normlab.bench / lab.seeds
        argv = [argv[0], "--", *argv[1:]]
    command = argv[0] if argv and not argv[0].startswith("-") else None
    where = f"normlab {command}" if command else "normlab"
    try:
        try:
            args = build_parser().parse_args(argv)
        except UsageError as exc:
            hint = _negative_value_hint(argv[1:]) if command == "bits" else ""
            raise UsageError(f"{exc}{hint}") from None
        rc = _dispatch(args)
        sys.stdout.flush()
        return rc
    except UsageError as exc:  # only what the command line got wrong; never internal errors
        print(f"{where}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:
        return _quiet_broken_pipe()
    except KeyboardInterrupt:
        print(f"{where}: interrupted", file=sys.stderr)
        return 130
