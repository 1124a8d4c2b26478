"""The ``gym-autoinstr`` command."""

from __future__ import annotations

import argparse
import sys


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(prog="gym-autoinstr", description="OpenTelemetry tracing for NeMo Gym.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    args = parser.parse_args(argv)
    from .version import __version__

    print(__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
