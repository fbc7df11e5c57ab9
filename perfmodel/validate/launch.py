"""What a failed training or calibration subprocess said, in one line.

torchrun ends a failed launch with a banner of '=' and a summary table; its last line says
nothing. The line worth reporting is the last exception or error line of the output, else its
last line that is not a rule.
"""

from __future__ import annotations

import re

ERROR_LINE = re.compile(r"\b\w*(Error|Exception)\b|\berror:")


def failure_line(out) -> str:
    """The one line of a failed ``subprocess.CompletedProcess`` (text mode) that says why."""
    lines = [line.strip() for line in (out.stderr or out.stdout or "").splitlines()]
    lines = [line for line in lines if line and not set(line) <= set("=-_*")]
    errors = [line for line in lines if ERROR_LINE.search(line)]
    return (errors or lines or ["(no output)"])[-1]
