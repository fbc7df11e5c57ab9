"""Analyses on top of predict: symbolic, heterogeneous, transient. They call the same pricing functions and own no formula."""
