"""The ``gym-autoinstr`` command: ``--version``, and ``doctor`` to check an install."""

from __future__ import annotations

import argparse
import sys


def main(argv: "list[str] | None" = None) -> int:
    parser = argparse.ArgumentParser(prog="gym-autoinstr", description="OpenTelemetry tracing for NeMo Gym.")
    parser.add_argument("--version", action="store_true", help="print the version and exit")
    commands = parser.add_subparsers(dest="command", metavar="command")
    doctor = commands.add_parser(
        "doctor",
        help="check that this environment would trace Gym, and say how to fix what would not",
        description="Check the installed Gym, every pointcut, the OpenTelemetry start-up (distro, configurator, "
        "instrumentors, exporters), span groups and Gym's own telemetry. Exits 1 when tracing would not work.",
    )
    doctor.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    args = parser.parse_args(argv)

    if args.command == "doctor":
        from .doctor import main as doctor_main

        return doctor_main(as_json=args.json)
    from .version import __version__

    print(__version__)
    return 0


if __name__ == "__main__":
    sys.exit(main())
