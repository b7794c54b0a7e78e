"""The suite's rotating tier: every `slow` and `browser` test, its module given one of three slots; `make test`
(and so CI) runs the slow tests of one slot, picked by the commit count, beside every other test, and
`make test-browser` the browser modules of that slot, so that any three consecutive commits run every one of them.
A module's tests that are neither slow nor browser run every time. `make test-all`, and pytest run by hand, run
them all.

    LAB_ROTATION=<commit count>   # `make test`, `make test-browser`: `git rev-list --count HEAD`
    LAB_ROTATION=all              # every slot (the default when it is unset)

The slots are balanced by each module's measured seconds of slow (or browser) tests on its xdist worker
(docs/measurements.md, "The test suite"), so that every commit's `make test` takes about as long.
"""

from __future__ import annotations

SLOTS = 3
ROTATION_VARIABLE = "LAB_ROTATION"
ROTATING_MARKERS = ("slow", "browser")

# module -> slot. Each slot holds about a third of the slow tests' seconds (`make test-all --durations=0` on an AMD
# EPYC Zen 4, 2 vCPUs, a module's slow tests' setup + call + teardown summed; test_benchmarks without the shared
# reproduced project's build, which every slot pays once), then of the browser tests' (`make test-browser`).
ROTATING: dict[str, int] = {
    "tests/test_benchmarks.py": 0,  # 149 s
    "tests/test_tracking_store.py": 0,  # 83
    "tests/test_tracking_server.py": 0,  # 76
    "tests/test_report.py": 0,  # 71
    "tests/test_report_inputs.py": 0,  # 65
    "tests/test_timing.py": 0,  # 61
    "tests/test_project_copy.py": 0,  # 36
    "tests/test_machines.py": 0,  # 35
    "tests/test_trace_analysis.py": 0,  # 16
    "tests/test_export_graph.py": 0,  # 10
    "tests/test_run_settling.py": 0,  # 1
    "tests/test_profile.py": 1,  # 127
    "tests/test_train_stage.py": 1,  # 84
    "tests/test_class_server.py": 1,  # 76
    "tests/test_signals.py": 1,  # 74
    "tests/test_timing_calibration.py": 1,  # 69
    "tests/test_hostile_params.py": 1,  # 63
    "tests/test_gpu_data.py": 1,  # 37
    "tests/test_ssh_remote.py": 1,  # 35
    "tests/test_allocator.py": 1,  # 6
    "tests/test_queue.py": 2,  # 105
    "tests/test_device_kinds.py": 2,  # 85
    "tests/test_last_good_results.py": 2,  # 80
    "tests/test_hostile_files.py": 2,  # 74
    "tests/test_machines_server.py": 2,  # 65
    "tests/test_sharing.py": 2,  # 63
    "tests/test_download_stage.py": 2,  # 43
    "tests/test_interrupts.py": 2,  # 27
    "tests/test_project_settings.py": 2,  # 14
    "tests/test_training.py": 2,  # 27
    "tests/test_energy_during_timing.py": 2,  # 8
    "tests/test_report_in_tools.py": 2,  # 7
    "tests/test_cuda_graph.py": 2,  # 4
    "tests/test_handin.py": 1,  # 5
    "tests/test_contracts.py": 1,  # 3
    # `make test-browser`
    "tests/browser/test_handin_views.py": 0,  # 77
    "tests/browser/test_mlflow_ui.py": 1,  # 63
    "tests/browser/test_tensorboard_ui.py": 1,  # 12
    "tests/browser/test_lab_guide.py": 2,  # 61
    "tests/browser/test_report_preview.py": 2,  # 21
    "tests/browser/test_handin_page.py": 2,  # 14
}


def chosen_slot(value: str) -> int | None:
    """The slot `$LAB_ROTATION` picks: a commit count's remainder; None (every slot) for "all" or nothing."""
    value = value.strip()
    if value in ("", "all"):
        return None
    if not value.isdigit():
        raise ValueError(f"{ROTATION_VARIABLE} must be a commit count or 'all', not {value!r}")
    return int(value) % SLOTS


def runs(module: str, slot: int | None, markers: frozenset[str] | set[str] = frozenset(ROTATING_MARKERS)) -> bool:
    """Whether a test of the module (`tests/test_x.py`) with these markers runs when `slot` is picked: a test with
    no rotating marker always does."""
    if slot is None or not set(markers) & set(ROTATING_MARKERS):
        return True
    return ROTATING.get(module, slot) == slot
