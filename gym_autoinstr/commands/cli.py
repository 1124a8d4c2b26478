"""The ``gym-autoinstr`` command: ``--version``, ``doctor`` to check an install, ``view`` to read traces."""

from __future__ import annotations

import argparse
import sys

from gym_autoinstr.commands.compare import command as compare_command
from gym_autoinstr.commands.export import command as export_command
from gym_autoinstr.commands.view import command as view_command


def build_parser() -> argparse.ArgumentParser:
    """The command line: every subcommand and its options (tests check the docs against it)."""
    parser = argparse.ArgumentParser(
        prog="gym-autoinstr",
        description="OpenTelemetry tracing for NeMo Gym. Tracing itself needs no command: run Gym under\n"
        "opentelemetry-instrument; these commands check an install and read what it wrote.",
        epilog="examples:\n"
        '  opentelemetry-instrument gym env start "+config_paths=[...]"   trace a Gym run\n'
        "  gym-autoinstr doctor                                            would this environment trace Gym?\n"
        "  gym-autoinstr view gym-autoinstr-runs/<run id>                  read the traces of a run",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    from gym_autoinstr.version import __version__

    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="command")
    doctor = commands.add_parser(
        "doctor",
        help="check that this environment would trace Gym, and say how to fix what would not",
        description="Check the installed Gym, every pointcut, the OpenTelemetry start-up (distro, configurator, "
        "instrumentors, exporters), that the configured OTLP endpoint accepts an empty export (a few seconds at most), "
        "span groups and Gym's own telemetry. Exits 1 when tracing would not work.",
    )
    doctor.add_argument("--json", action="store_true", help="print the diagnosis as JSON")
    doctor.add_argument("--offline", action="store_true", help="do not contact the OTLP endpoint (air-gapped checks)")
    doctor.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        help="also print the notes and every section in full: each pointcut, process-wide patch and fast-path part",
    )
    view_command.add_parser(commands)
    export_command.add_parser(commands)
    compare_command.add_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.command == "compare":
        return compare_command.run(args)
    if args.command == "export":
        return export_command.run(args)
    if args.command == "view":
        return view_command.run(args)

    if args.command == "doctor":
        from gym_autoinstr.commands.doctor import main as doctor_main

        return doctor_main(as_json=args.json, offline=args.offline, verbose=args.verbose)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
