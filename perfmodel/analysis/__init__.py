"""Analyses that reuse the single-job pricing: jobs sharing a GPU (contention, MIG), jobs sharing a
cluster's network, packing advice. They call ``perfmodel.predict`` and own no kernel formula."""
