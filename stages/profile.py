"""DVC stage `profile@<batch>-<device>-<mode>`: time and profile one combination of the matrix.

    python -m stages.profile BATCH_SIZE DEVICE MODE

The three arguments are the matrix item DVC expands from `profile.batch_sizes`, `profile.devices`
and `profile.modes` in params.yaml; every other setting comes from params.yaml as usual.
"""

import sys

from pipeline.atomic import AtomicOutputs
from pipeline.cli import run_stage
from pipeline.config import load_params
from pipeline.paths import DATA_ROOT, MODEL_CHECKPOINT, profile_outputs
from pipeline.profile_record import OperatorRow, parse_combination, write_record
from pipeline.profiling import operators_markdown, prepare_profile, run_parameters, run_profile
from pipeline.tables import records_csv
from pipeline.tracking import open_tracker


def main() -> None:
    combination = parse_combination(sys.argv[1:])
    params = load_params()
    config = params.profile
    setup = prepare_profile(combination, config, MODEL_CHECKPOINT, DATA_ROOT)
    paths = profile_outputs(combination.name)

    with open_tracker("profile", params.tracking, variant=combination.name) as tracker, AtomicOutputs() as outputs:
        tracker.log_params(run_parameters(setup, config.top_k))
        tracker.set_tags({"data.digest": setup.data_digest, "combination": combination.name})
        record = run_profile(setup, config.top_k, outputs.staged(paths.trace))
        markdown = operators_markdown(record)
        outputs.write_text(paths.table_markdown, markdown)
        outputs.write_text(paths.table_csv, records_csv(OperatorRow, record.top_operators))
        outputs.write_text(paths.record, write_record(record))
        metrics = {**record.timing.as_metrics(), **record.graph_metrics()}  # graph: cuda only
        outputs.write_json(paths.timing, metrics)
        tracker.log_metrics(metrics)
        tracker.log_series("step_time_ms", record.step_times_ms)
        tracker.log_text("profile/top_operators", markdown, "top_operators.md")
        for path in (paths.table_csv, paths.record, paths.trace):
            tracker.log_artifact(outputs.staged(path))
    print(markdown)


if __name__ == "__main__":
    run_stage("profile", main)
