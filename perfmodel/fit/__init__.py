"""Fitting: measurement tables in, closed-form cost models (a Profile) out."""
