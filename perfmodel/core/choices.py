"""Vocabularies of choices shared by several layers (declared once, as data)."""

# nccl-tests collectives (NVIDIA/nccl-tests doc/PERFORMANCE.md); sendrecv is point to point
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "all_to_all", "sendrecv")
LEVELS = ("intra", "inter")  # fabric levels of a profile: inside a node, between nodes
ALGORITHMS = ("hierarchical", "ring")  # how a collective spanning nodes is priced
ENTRY_KEYS = ("form", "params", "cv_mape", "n_points", "range_bytes", "source")  # one fitted entry
