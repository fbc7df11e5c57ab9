"""Analyses that compose the pricing functions of the layers below (they own no formula)."""
