"""The suite's rotating tier: the longest modules, each given one of three slots; `make test` (and so CI) runs the
modules of one slot, picked by the commit count, beside everything else, so that any three consecutive commits run
every one of them. `make test-all`, and pytest run by hand, run them all.

    LAB_ROTATION=<commit count>   # `make test`: `git rev-list --count HEAD`
    LAB_ROTATION=all              # every slot (the default when it is unset)

The slots are balanced by each module's measured seconds on its xdist worker (docs/measurements.md,
"The test suite"), so that every commit's `make test` takes about as long.
"""

from __future__ import annotations

SLOTS = 3
ROTATION_VARIABLE = "LAB_ROTATION"

# module -> slot, each slot about a third of the tier's seconds (`make test --durations=0` on an AMD EPYC Zen 4, 2
# vCPUs, a module's setup + call + teardown summed; test_benchmarks without the shared project's build, which the
# first module that needs it pays in any slot).
ROTATING: dict[str, int] = {
    "tests/test_benchmarks.py": 0,  # 243 s
    "tests/test_class_server.py": 0,  # 73
    "tests/test_hostile_params.py": 0,  # 51
    "tests/test_sharing.py": 0,  # 39
    "tests/test_queue.py": 1,  # 96
    "tests/test_machines_server.py": 1,  # 92
    "tests/test_signals.py": 1,  # 87
    "tests/test_last_good_results.py": 1,  # 84
    "tests/test_hostile_files.py": 2,  # 59 (slot 1 ran 464 s of `make test` in CI's rehearsal, slot 0 400 s)
    "tests/test_timing_calibration.py": 2,  # 95
    "tests/test_train_stage.py": 2,  # 91
    "tests/test_tracking_store.py": 2,  # 85
    "tests/test_tracking_server.py": 2,  # 74
}


def chosen_slot(value: str) -> int | None:
    """The slot `$LAB_ROTATION` picks: a commit count's remainder; None (every slot) for "all" or nothing."""
    value = value.strip()
    if value in ("", "all"):
        return None
    if not value.isdigit():
        raise ValueError(f"{ROTATION_VARIABLE} must be a commit count or 'all', not {value!r}")
    return int(value) % SLOTS


def runs(module: str, slot: int | None) -> bool:
    """Whether the module (`tests/test_x.py`) runs when `slot` is picked."""
    return slot is None or ROTATING.get(module, slot) == slot
