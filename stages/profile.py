"""DVC stage `profile@<batch>-<device>-<mode>`: time and profile one combination of the matrix.

    python -m stages.profile                         # under DVC: the combination is the stage's name
    python -m stages.profile BATCH_SIZE DEVICE MODE  # a direct run

DVC's command line holds no matrix value (see pipeline/profiling/matrix.py); every other setting comes from
params.yaml as usual.
"""

import contextlib
import sys

from tqdm import tqdm

from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import DATA_ROOT, HARDWARE_ROOFS, MODEL_CHECKPOINT, ProfileOutputs, profile_outputs
from pipeline.common.stage_runner import run_stage
from pipeline.params.loading import load_params
from pipeline.params.schema import Params
from pipeline.profiling.artifacts import ProfileTexts, log_profile, write_profile_outputs
from pipeline.profiling.matrix import stage_combination
from pipeline.profiling.processes import WorkerServer, forked_worker_server
from pipeline.profiling.record import Combination, ProfileRecord
from pipeline.profiling.run import prepare_profile, run_parameters, run_profile
from pipeline.profiling.texts import measurement_warnings
from pipeline.tracking.tags import DATA_DIGEST_TAG, MODEL_DIGEST_TAG, hardware_tags
from pipeline.tracking.tracker import open_tracker


def main() -> None:
    params = load_params()
    combination = stage_combination(params.profile, sys.argv[1:])
    config = params.profile
    with contextlib.ExitStack() as stack:
        # The timing processes' server first, forked before this process runs any tensor code: it starts from
        # the clean state of a fresh server without importing torch again, and it forks no timing process
        # before run_profile asks (README, "Timing you can trust").
        server = (
            stack.enter_context(forked_worker_server(training=combination.mode != "inference"))
            if config.processes > 1
            else None
        )
        record, texts, paths = _profile(params, combination, server)
    print(texts.console(record, paths))
    for warning in measurement_warnings(record):
        print(f"Warning: {warning}.", file=sys.stderr)


def _profile(
    params: Params, combination: Combination, server: WorkerServer | None
) -> tuple[ProfileRecord, ProfileTexts, ProfileOutputs]:
    config = params.profile
    setup = prepare_profile(combination, config, MODEL_CHECKPOINT, DATA_ROOT, HARDWARE_ROOFS)
    paths = profile_outputs(combination.name)

    with open_tracker("profile", params.tracking, variant=combination.name) as tracker, AtomicOutputs() as outputs:
        tracker.log_params(run_parameters(setup, config.top_k))
        tracker.set_tags(
            {
                DATA_DIGEST_TAG: setup.data_digest,
                MODEL_DIGEST_TAG: setup.model_digest,
                "combination": combination.name,
                # Tags, as on the train run: they say where it ran; MLflow's Compare lists params to compare.
                **hardware_tags(setup.hardware),
            }
        )
        tracker.link_training(setup.model_digest)
        with tqdm(total=setup.processes, desc="timing processes", unit="process", disable=setup.processes < 2) as bar:
            record = run_profile(
                setup,
                config.top_k,
                outputs.staged(paths.trace),
                config.allocator_whatif_s,
                lambda _: bar.update(),
                server,
            )
        texts = write_profile_outputs(outputs, paths, record)
        log_profile(tracker, outputs, paths, record, texts)
    return record, texts, paths


if __name__ == "__main__":
    run_stage("profile", main)
