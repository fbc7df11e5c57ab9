"""The command line the preset generators share (tools/cnn_models.py, tools/cifar_models.py)."""

from __future__ import annotations

import argparse


def presets_main(write, description: str, what: str, argv=None) -> int:
    """The command line of a preset generator: ``--write-presets [--out FOLDER]`` runs ``write(out)``."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--write-presets", action="store_true", help=f"regenerate {what}")
    parser.add_argument("--out", default=None, help="folder to write to (default: the package's data/graphs)")
    args = parser.parse_args(argv)
    if not args.write_presets:
        parser.print_help()
        return 0
    for path in write(args.out):
        print(f"wrote {path}")
    return 0
