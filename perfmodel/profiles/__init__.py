"""Profiles: the fitted cost models of one machine (read-only), datasheet derivation, the bundled JSON."""
