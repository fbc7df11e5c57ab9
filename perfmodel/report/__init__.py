"""Human-readable output: tables and plots (no cost formulas here)."""
