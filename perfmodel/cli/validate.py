"""``perfmodel validate``: measured vs predicted steps, per row and in summary.

    perfmodel validate --measured examples/measured_sample.csv            # rows measured elsewhere
    perfmodel validate --quick --work-dir val --out val/results.csv       # calibrate, fit, train, predict
    perfmodel validate --quick --profile val/profile.json                 # reuse a calibrated host
    perfmodel validate --measured runs.csv --max-error 25                 # exit 1 if median |error| > 25%
    perfmodel validate --published                                        # the published runs, per stack and GPU
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from perfmodel.cli import NONNEGATIVE_INT, POSITIVE_FLOAT, POSITIVE_INT
from perfmodel.core.errors import InvalidInputError
from perfmodel.profiles.profile import load_profile
from perfmodel.validate.loop import results_table, summarize, validate_measured, validate_runs
from perfmodel.validate.runs import median_abs_error, report, score_runs


def add_parsers(subparsers) -> None:
    p = subparsers.add_parser("validate", help="compare predictions with measured training steps")
    p.add_argument("--measured", default=None, help="CSV of measured steps (docs/validation.md); "
                                                    "without it, real runs are trained on this machine")
    p.add_argument("--profile", default=None,
                   help="with --measured: profile for rows without one (default: each GPU's bundled profile); "
                        "real runs on the CPU: a calibrated host folder or its profile.json (default: calibrate)")
    p.add_argument("--gpu", default=None, help="real runs on a GPU: the catalog GPU (default: the one torch reports)")
    p.add_argument("--quick", action="store_true", help="tiny models, quick calibration (about 2 min on 2 cores)")
    p.add_argument("--work-dir", default=None, help="where calibration tables, profile and runs go (default: temp)")
    p.add_argument("--out", default=None, help="write the results as CSV")
    p.add_argument("--threads", type=POSITIVE_INT, default=1, help="torch threads per training process on the CPU")
    p.add_argument("--procs", type=POSITIVE_INT, default=2, help="processes of the data-parallel runs")
    p.add_argument("--steps", type=POSITIVE_INT, default=10, help="timed steps per run")
    p.add_argument("--warmup", type=NONNEGATIVE_INT, default=3, help="untimed steps per run")
    p.add_argument("--max-error", type=POSITIVE_FLOAT, default=None, metavar="PCT",
                   help="exit with status 1 when the median |error| exceeds PCT percent")
    p.add_argument("--published", action="store_true",
                   help="score the bundled published multi-GPU runs: median |error| per stack and per GPU, "
                        "the worst rows with their terms (python -m perfmodel.validate.runs)")
    p.set_defaults(func=cmd_validate)


def cmd_validate(args) -> int:
    if args.published:
        return _published(args)
    notes: tuple = ()
    if args.profile and not Path(args.profile).exists():  # a name: check it now, not once per row or after calibrating
        load_profile(args.profile)
    if args.measured and args.quick:
        raise InvalidInputError("--measured compares rows measured elsewhere; --quick runs and measures its own: "
                                "give one of them")
    if not args.measured and args.procs > (os.cpu_count() or 1):
        raise InvalidInputError(f"--procs {args.procs} exceeds this host's {os.cpu_count()} CPUs "
                                f"(valid: 1-{os.cpu_count()}): the data-parallel runs would only time oversubscription")
    if args.measured:
        results, bad = validate_measured(args.measured, args.profile)
    else:
        work = args.work_dir or tempfile.mkdtemp(prefix="perfmodel-validate-")
        found = validate_runs(work, profile=args.profile, gpu=args.gpu, quick=args.quick,
                              threads=args.threads, procs=args.procs, steps=args.steps, warmup=args.warmup)
        results, bad, notes = found.results, found.bad, found.notes
        print(f"work folder: {work}")
    for note in notes:
        print(f"note: {note}")
    for row in bad:
        print(f"{'skipped ' if row.skipped else 'note: '}{row}")
    print(results_table(results))
    if args.out and len(results):
        results.to_csv(args.out, index=False)
        print(f"wrote {args.out}")
    if not len(results):
        return 1  # nothing was compared: not a pass
    median = summarize(results)["median_abs_error_pct"]
    if args.max_error is not None and not median <= args.max_error:
        print(f"median |error| {median:.1f}% exceeds --max-error {args.max_error:g}%")
        return 1
    return 0


def _published(args) -> int:
    """``--published``: the bundled published runs scored (each with its GPU's bundled profile)."""
    if args.measured or args.quick:
        raise InvalidInputError("--published scores the bundled published runs; --measured and --quick score "
                                "other rows: give one of them")
    results = score_runs()
    print(report(results))
    if args.out:
        results.to_csv(args.out, index=False)
        print(f"wrote {args.out}")
    median = 100 * median_abs_error(results)
    if args.max_error is not None and not median <= args.max_error:
        print(f"median |error| {median:.1f}% exceeds --max-error {args.max_error:g}%")
        return 1
    return 0
