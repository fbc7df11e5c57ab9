"""What each optimizer keeps and moves per parameter (fp32 states; torch 2.13 torch/optim/adamw.py, sgd.py, rmsprop.py).

``Strategy.optimizer`` names one of ``MOMENTS``:

* ``"adamw"``: exp_avg and exp_avg_sq;
* ``"sgd"``: with momentum, momentum_buffer;
* ``"rmsprop"``: square_avg and, with momentum (the TF-style EfficientNet recipes train with 0.9), momentum_buffer.

A step reads the weight, its gradient and each state and writes the weight and each state back
(``OPTIMIZER_BYTES``); costs/compute.py scales the measured AdamW kernel by these bytes.
"""

from __future__ import annotations

MOMENTS = {"adamw": 2, "sgd": 1, "rmsprop": 2}
# fp32 bytes per parameter one step reads and writes: (2 + states) read, (1 + states) written, 4 B each
OPTIMIZER_BYTES = {name: 4.0 * (3 + 2 * states) for name, states in MOMENTS.items()}


def moment_bytes(optimizer: str) -> float:
    """Bytes per parameter of an fp32 optimizer's state tensors."""
    return 4.0 * MOMENTS[optimizer]
