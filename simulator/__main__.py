"""Command line: ``python -m simulator {serve,loadgen,run,table3,compaction,live-run,fit,warning-eval,live-warning,
replay,attribution-check,forecast-validate}``; ``--help`` on each."""

from __future__ import annotations

import argparse
import importlib
import logging
import sys

from simulator.config import SimConfigError

log = logging.getLogger("simulator")

# One line per subcommand: (name, help, module, its add-arguments function, its command function).
# The module is imported when the parser is built; the command gets the parsed arguments and returns
# the exit status.
SUBCOMMANDS: list[tuple[str, str, str, str, str]] = [
    (
        "serve",
        "the simulated engine behind a vLLM-compatible HTTP API",
        "simulator.serve_cli",
        "add_serve_arguments",
        "serve_command",
    ),
    (
        "loadgen",
        "closed-loop agent sessions (and optional RAG) through the sidecar",
        "simulator.loadgen",
        "add_arguments",
        "loadgen_command",
    ),
    (
        "run",
        "one offline run of a scenario under a control (--fit: the cost model fitted to a real engine)",
        "simulator.fit",
        "add_run_with_fit_arguments",
        "run_with_fit_command",
    ),
    (
        "table3",
        "pairs and the five controls across seeds (the published table 3)",
        "simulator.experiments",
        "add_table3_arguments",
        "table3_command",
    ),
    (
        "compaction",
        "rag-storm: request-count compaction trigger vs the compaction gate",
        "simulator.compaction_experiment",
        "add_compaction_arguments",
        "compaction_command",
    ),
    (
        "live-run",
        "agent workloads against a real engine through the sidecar, in wall-clock time",
        "simulator.live_run",
        "add_arguments",
        "live_run_command",
    ),
    (
        "fit",
        "probe a real engine and fit the cost model and pool (fit.json)",
        "simulator.fit",
        "add_fit_arguments",
        "fit_command",
    ),
    (
        "replay",
        "what would have happened had the control switched at T, from an incident bundle",
        "simulator.replay",
        "add_arguments",
        "command",
    ),
    (
        "forecast-validate",
        "the Budgeter forecast of budgeter-park against the live collapse demo switched for real",
        "simulator.forecast_validate",
        "add_arguments",
        "command",
    ),
    (
        "warning-eval",
        "lead time and false alarms of the collapse-risk warning across the tipping point",
        "simulator.warning_eval",
        "add_arguments",
        "command",
    ),
    (
        "live-warning",
        "the collapse-risk warning replayed on live-run runs (sidecar and engine-only inputs)",
        "simulator.live_warning",
        "add_arguments",
        "command",
    ),
    (
        "attribution-check",
        "why prompt tokens were missed: core.attribution against the simulator's ground truth",
        "simulator.attribution_check",
        "add_arguments",
        "command",
    ),
]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m simulator", description=__doc__)
    parser.add_argument("--log-level", default="info", choices=["debug", "info", "warning", "error"])
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text, module_name, add_arguments, command in SUBCOMMANDS:
        module = importlib.import_module(module_name)
        p = sub.add_parser(name, help=help_text)
        getattr(module, add_arguments)(p)
        p.set_defaults(func=getattr(module, command))
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(
        level=getattr(logging, args.log_level.upper()),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    try:
        return int(args.func(args) or 0)
    except SimConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
