"""DVC stage `profile@<device>`: time every batch size x mode of one device paired, and profile each.

    python -m stages.profile          # under DVC: the device is the stage's name
    python -m stages.profile DEVICE   # a direct run

DVC's command line holds no matrix value (see pipeline/profiling/matrix.py); every other setting comes from
params.yaml as usual.
"""

import contextlib
import sys

from tqdm import tqdm

from pipeline.common.interrupts import pause_at
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import DATA_ROOT, HARDWARE_ROOFS, MODEL_CHECKPOINT, DeviceProfileOutputs
from pipeline.common.stage_runner import run_stage_process
from pipeline.params.loading import load_params
from pipeline.profiling.artifacts import log_profile, write_comparison_outputs, write_profile_outputs
from pipeline.profiling.matrix import stage_device
from pipeline.profiling.processes import forked_worker_server, worker_server
from pipeline.profiling.run import prepare_profiles, run_description, run_device_profile, timing_spec
from pipeline.records.profile import profile_matrix
from pipeline.records.wording import disagreement_said, stage_warnings
from pipeline.tracking.lifecycle import runs_started_early, settled_after_commit


def main() -> None:
    params = load_params()
    config = params.profile
    device = stage_device(config, sys.argv[1:])
    wanted = profile_matrix(config, device)
    with contextlib.ExitStack() as stack:
        # The timing processes' server first, forked before this process runs any tensor code: it starts from
        # the clean state of a fresh server without importing torch again (pipeline.profiling.processes).
        training = any(combination.mode != "inference" for combination in wanted)
        # The other program starts import torch while this process forks its own server, prepares and opens the
        # tracking store: nothing is timed until every server is ready (pipeline.profiling.processes).
        others = min(config.program_starts, config.processes) - 1 if config.processes > 1 else 0
        starting = [stack.enter_context(worker_server(training, ready=False)) for _ in range(others)]
        server = stack.enter_context(forked_worker_server(training=training)) if config.processes > 1 else None
        pause_at("server-forked")
        setups = prepare_profiles(wanted, config, MODEL_CHECKPOINT, DATA_ROOT, HARDWARE_ROOFS)
        # Each combination's run exists from here on, so that a stop during the timing ends it (and the pipeline's
        # run) KILLED; it is logged into once its combination is measured. After the fork: MLflow may start threads,
        # which a fork must not copy.
        run_ids = stack.enter_context(runs_started_early("profile", params.tracking, [c.name for c in wanted]))
        pause_at("prepared")
        spec = timing_spec(setups, config, MODEL_CHECKPOINT, DATA_ROOT)
        paths = [c.outputs for c in wanted]
        device_paths = DeviceProfileOutputs(device)
        with (
            settled_after_commit() as ended,  # each combination's run: current once the outputs are in place
            AtomicOutputs() as outputs,
            tqdm(total=config.processes + len(wanted), unit="pass") as bar,
        ):
            # The device's folders are this run's whole output (dvc.yaml keeps them, `persist`): what it no longer
            # writes (a batch size or mode removed from params.yaml) goes when the new set is committed.
            outputs.own(device_paths.folder)
            outputs.own(device_paths.traces)
            records, comparisons = run_device_profile(
                setups,
                spec,
                config.processes,
                config.top_k,
                [outputs.staged(path.trace) for path in paths],
                config.allocator_whatif_s,
                lambda what: (bar.set_description(what), bar.update()),
                server,
                config.program_starts,
                starting,
            )
            pause_at("traced")
            comparison_text = write_comparison_outputs(outputs, device_paths, comparisons)
            pause_at("comparisons-written")
            disagreement_matters, said_for_all = disagreement_said(records, comparisons)
            for setup, record, path in zip(setups, records, paths, strict=True):
                matters = record.combination.name in disagreement_matters
                texts = write_profile_outputs(outputs, path, record, said_for_all, matters)
                description = run_description(setup, config.top_k)
                run_id = run_ids[record.combination.name]
                ended.append(
                    log_profile(params.tracking, description, outputs, path, record, texts, comparison_text, run_id)
                )
                pause_at("logging")  # after the first combination's run has ended
            pause_at("logged")
    print(comparison_text)
    for warning in stage_warnings(records, comparisons):
        print(f"Warning: {warning}.", file=sys.stderr)


if __name__ == "__main__":
    run_stage_process("profile", main)
