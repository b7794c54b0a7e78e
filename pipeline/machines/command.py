"""`python -m pipeline.machines`: read the store, build the report, write it atomically."""

from __future__ import annotations

import argparse
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

from pipeline.common.credentials import split_user_info
from pipeline.common.stage_runner import run_stage
from pipeline.machines.report import FIGURES, HTML_FILE, MARKDOWN_FILE, build_machines_report, write_report
from pipeline.machines.runs import read_store
from pipeline.params.loading import load_params
from pipeline.tracking.store import tracking_uri
from pipeline.tracking.tags import ID_TAG, machine_tags

DEFAULT_OUTPUT = Path("machines")


def run(arguments: Sequence[str] | None = None) -> None:
    """The command line, run as a stage is: user errors, Ctrl-C and SIGTERM become messages and exit codes."""
    run_stage("machines report", lambda: main(sys.argv[1:] if arguments is None else arguments))


def main(arguments: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m pipeline.machines",
        description="Compare the profile runs of every machine in the MLflow tracking store "
        "($MLFLOW_TRACKING_URI, else the project's mlflow.db).",
    )
    parser.add_argument("--output", type=Path, default=DEFAULT_OUTPUT, help="folder for the report (default: machines)")
    parser.add_argument("--experiment", help="MLflow experiment (default: tracking.experiment in params.yaml)")
    parser.add_argument("--baseline", help="machine the ratios are relative to: a name or id (default: this machine)")
    options = parser.parse_args(arguments)
    experiment = options.experiment
    if experiment is None:
        experiment = load_params().tracking.experiment
    uri = tracking_uri()
    runs, left_out = read_store(uri, experiment)
    source = f"`{split_user_info(uri)[0]}` (experiment `{experiment}`)"
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / FIGURES).mkdir()
        report = build_machines_report(
            runs, left_out, source, Path(scratch) / FIGURES, machine_tags()[ID_TAG], options.baseline
        )
        write_report(report, Path(scratch), options.output)
    machines = len({row.machine_id for row in report.rows})
    groups = len({row.group for row in report.rows})
    print(
        f"{machines} machine(s), {len(report.rows)} rows in {groups} group(s), {len(left_out)} run(s) left out -> "
        f"{options.output / MARKDOWN_FILE}, {options.output / HTML_FILE}"
    )
