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
<<<<<<< HEAD
from pipeline.profiling import measurement_warnings, operators_markdown, prepare_profile, run_parameters, run_profile
=======
from pipeline.profiling import operators_markdown, prepare_profile, run_parameters, run_profile
from pipeline.step_report import kernels_markdown, step_metrics
>>>>>>> issue-13
from pipeline.tables import records_csv
from pipeline.trace_analysis import KernelStats
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
        markdown, kernels, step = operators_markdown(record), kernels_markdown(record), step_metrics(record.analysis)
        outputs.write_text(paths.table_markdown, markdown)
        outputs.write_text(paths.table_csv, records_csv(OperatorRow, record.top_operators))
        outputs.write_text(paths.kernel_table_markdown, kernels)
        outputs.write_text(paths.kernel_table_csv, records_csv(KernelStats, record.analysis.top_kernels))
        outputs.write_text(paths.record, write_record(record))
<<<<<<< HEAD
        outputs.write_json(paths.timing, record.metrics())
        tracker.log_metrics(record.metrics())
        tracker.log_series("block_step_time_ms", record.block_times_ms)
=======
        outputs.write_json(paths.timing, record.timing.as_metrics())
        outputs.write_json(paths.step_analysis, step)
        tracker.log_metrics({**record.timing.as_metrics(), **step})
        tracker.log_series("step_time_ms", record.step_times_ms)
>>>>>>> issue-13
        tracker.log_text("profile/top_operators", markdown, "top_operators.md")
        tracker.log_text("profile/top_kernels", kernels, "top_kernels.md")
        for path in (paths.table_csv, paths.kernel_table_csv, paths.record, paths.trace):
            tracker.log_artifact(outputs.staged(path))
<<<<<<< HEAD
    print(markdown)
    for warning in measurement_warnings(record):
        print(f"Warning: {warning}.", file=sys.stderr)
=======
    print(markdown + "\n" + kernels + "\n" + f"{record.analysis.anatomy.verdict}: {record.analysis.anatomy.reason}")
>>>>>>> issue-13


if __name__ == "__main__":
    run_stage("profile", main)
