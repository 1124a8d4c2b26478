"""The ``gym-autoinstr`` command: ``--version``, ``doctor`` to check an install, ``view`` to read traces."""

from __future__ import annotations

import argparse
import sys


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number of traces, 1 or more, not {text!r}")
    return value


def main(argv: list[str] | None = None) -> int:
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
    view = commands.add_parser(
        "view",
        help="show traces as waterfalls in the terminal, or as one HTML page",
        description="Read a run directory written by the embedded default (or OTLP-JSON files, or - for "
        "standard input) and join every process's spans by trace. Lists the traces, one line each (start-up "
        "traces apart); --trace or --rollout draws that trace as a waterfall. Lines fit the terminal.",
    )
    view.add_argument("paths", nargs="*", metavar="PATH", help="run directory, file, or - (default: .)")
    view.add_argument("--trace", metavar="ID", help="draw the trace whose id starts with ID (any unique prefix)")
    view.add_argument("--rollout", metavar="ID", help="draw the trace of this rollout id")
    view.add_argument("--slowest", type=_positive, metavar="N", help="only the N slowest traces, slowest first")
    view.add_argument("--sort", choices=("start", "duration"), default="start", help="list order (default: start time)")
    view.add_argument(
        "--service", metavar="NAME", help="only traces with a span of this service (agent or nemo-gym/agent)"
    )
    view.add_argument(
        "--attr",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="only traces with a span or resource attribute KEY equal to VALUE (repeatable)",
    )
    view.add_argument("--status", choices=("ok", "error"), help="only traces without / with an error")
    view.add_argument("--errors", action="store_true", help="only traces with an error (same as --status error)")
    view.add_argument("--json", action="store_true", help="print the list (or the chosen trace's spans) as JSON")
    view.add_argument("--html", metavar="FILE", help="write one self-contained HTML page instead")
    view.add_argument(
        "--html-max-traces",
        type=_positive,
        default=None,
        metavar="N",
        help="draw at most N traces on the page (errors and the slowest first; every trace is listed; default "
        "800, about 20 MB at most)",
    )
    view.add_argument(
        "--metrics",
        action="store_true",
        help="print a per-server 'why is it slow' summary from the run's metrics instead of traces",
    )
    args = parser.parse_args(argv)

    if args.command == "view":
        from gym_autoinstr.commands.view import main as view_main

        return view_main(
            args.paths,
            rollout=args.rollout,
            slowest=args.slowest,
            errors=args.errors,
            html_file=args.html,
            metrics=args.metrics,
            trace_id=args.trace,
            service_name=args.service,
            attributes=args.attr,
            status=args.status,
            sort=args.sort,
            as_json=args.json,
            **({"max_detail": args.html_max_traces} if args.html_max_traces else {}),
        )

    if args.command == "doctor":
        from gym_autoinstr.commands.doctor import main as doctor_main

        return doctor_main(as_json=args.json, offline=args.offline, verbose=args.verbose)
    parser.print_help()
    return 0


if __name__ == "__main__":
    sys.exit(main())
