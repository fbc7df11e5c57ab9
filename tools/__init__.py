"""Build-time tools of this repository (not installed with the package)."""
