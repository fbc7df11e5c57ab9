"""Closed forms (numpy body + sympy twin) as an explicit registry."""
