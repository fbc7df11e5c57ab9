"""Running a module as a command (``python -m perfmodel.validate.runs``, ``python -m tools.cnn_report``).

The reproduce commands of docs/ are module mains. As the ``perfmodel`` CLI does, an error the user
caused (:class:`~perfmodel.core.errors.PerfModelError`) or a file that cannot be read or written
becomes one line on stderr and exit status 2, not a traceback; an option a module does not take is
refused by argparse instead of being ignored.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from perfmodel.core.errors import PerfModelError

USAGE_ERROR = 2  # argparse's and the perfmodel CLI's status for input that cannot be used


def run_command(main: Callable[..., int | None], argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """``main(argv)``'s status (0 for None); a perfmodel or OS error printed as ``prog: error: ...``, status 2."""
    try:
        code = main(argv)
        sys.stdout.flush()  # a reader that stopped early (| head) shows here, not at interpreter exit
        return int(code or 0)
    except BrokenPipeError:  # the reader has what it wanted; keep the exit flush quiet too
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except (PerfModelError, OSError) as exc:
        name = prog or (sys.argv[0].rsplit("/", 1)[-1] if sys.argv and sys.argv[0] else "perfmodel")
        print(f"{name}: error: {exc}", file=sys.stderr)
        return USAGE_ERROR


def no_options(doc: str | None, argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse the arguments of a command that takes none: ``--help`` prints its docstring's first line,
    anything else is refused (argparse exits with status 2 and its usage)."""
    first = (doc or "").strip().splitlines()
    return argparse.ArgumentParser(description=first[0] if first else None).parse_args(argv)
