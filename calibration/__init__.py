"""Measure a real machine into the tables ``perfmodel fit`` reads.

- ``python -m calibration.compute --out DIR [--quick]``: kernels of one device -> compute.csv
- ``torchrun --nproc-per-node G -m calibration.collectives --out DIR``: collectives -> collectives.csv

Both append rows durably and resume where they stopped; docs/calibration.md
describes the grids, the timing method and the schema. This package imports
torch; ``perfmodel`` never imports it.
"""
