"""Memory order of a search grid's arrays (``explore.space.Factored``): rows innermost.

A grid's rows are its one long axis; its other axes hold 2-6 choices each, the last (dp_overlap)
two. numpy's elementwise loops follow their operands' memory order, so a C-order array that varies
along the rows and a later axis, combined with one broadcast along that axis, is looped over two or
three cells at a time (with buffered copies of the broadcast operand). Laid out rows innermost
(Fortran order), the terms computed from it loop over the rows. Only the memory order differs,
never a number (docs/explore.md, "Further shortcuts").
"""

from __future__ import annotations

import numpy as np


def rows_inner(a):
    """``a`` in Fortran order (its first axis innermost in memory) when it varies along several axes;
    anything else as it is."""
    return np.asfortranarray(a) if np.ndim(a) > 1 and sum(n > 1 for n in np.shape(a)) > 1 else a
