"""Each step's energy from the timing itself: the counter is polled by a separate process while the steps are timed,
and each step's power is fitted from which step ran between the counter's updates.

    python -m pipeline.profiling.energy_during_timing SOURCE   # the poller (started by the timing process)

Windows of their own per step (pipeline.profiling.energy.measure_energy) must each last many update periods for
the counter's lag to stay small: on NVML's slow counter, seconds per step and timing process, which made
`profile@cuda` much longer (docs/measurements.md). The interleaved timing already runs every step for seconds, in
blocks of 10-100 ms in random order, so the counter's updates during it hold the energy; they need only be
attributed to the steps.

The poller (a process of its own, so that neither the GIL nor a slow read touches the timed steps) reads the counter
without pause and keeps each change with the clock readings that bracket it: the update lies between the reading
before and the one that saw the change. The timing process records when each step's warm-up and block began and
ended (pipeline.profiling.timing.time_interleaved's spans), on the same system-wide monotonic clock. Between two
consecutive updates the counter grew by the energy of whatever ran in that interval, shifted by the counter's own
lag (unknown, the same at every update): a sum over steps of power x time spent in the step. Least squares over all
intervals inside the timing gives each step's power; the lag is the shift, within two update periods, that fits
best. A step's energy is its power times its median step time in the same process. The blocks' random order makes
the intervals' mixes of steps differ, which is what lets the fit tell the steps apart; a counter that averaged the
power over many updates would blur them, which the comparison with separate windows (benchmarks/energy_cost.py)
shows where it happens.

Torch-free, as pipeline.profiling.energy.
"""

from __future__ import annotations

import json
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from pipeline.devices.counters import EnergyCounter, Unavailable, open_counter

PAUSE_S = 0.0002  # between readings: a counter cheap to read (RAPL) is not read flat out on a core of its own
LAG_STEPS = 41  # lags tried, evenly from 0 to LAG_PERIODS update periods
LAG_PERIODS = 2.0
MIN_INTERVALS_PER_STEP = 4  # update intervals inside the timing the fit needs per step fitted (and one more)
STOP_TIMEOUT_S = 10.0
_PROJECT_ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Update:
    """One change of the counter: its new value, and the clock readings around the two reads that bracket it."""

    after_s: float  # the update happened after this (the start of the last read that saw the old value) ...
    before_s: float  # ... and before this (the end of the read that saw the new one)
    millijoules: int

    @property
    def at_s(self) -> float:
        return (self.after_s + self.before_s) / 2


@dataclass(frozen=True)
class Span:
    """A stretch of the timing that ran one step only (its warm-up and its timed block), on time.perf_counter."""

    item: int
    start_s: float
    end_s: float


@dataclass(frozen=True)
class PowerFit:
    """Each step's mean power while it ran, fitted from the counter's updates during the timing."""

    power_w: tuple[float, ...]  # per item
    intervals: int  # update intervals the fit used
    update_period_s: float  # their median length
    lag_s: float  # the shift of the counter that fitted best
    residual_pct: float  # root mean square misfit of an interval's energy, in % of the mean interval's


def poll(counter: EnergyCounter, stopped: Callable[[], bool], pause_s: float = PAUSE_S) -> list[Update]:
    """Read `counter` until `stopped()`, keeping every change with its bracket (the first reading too, as an
    update with no lower bound). Raises ValueError if the counter goes backwards."""
    clock = time.perf_counter
    started = clock()
    last = counter.millijoules()
    last_started = started
    updates = [Update(started, clock(), last)]
    while not stopped():
        read_started = clock()
        value = counter.millijoules()
        read_ended = clock()
        if value < last:
            raise ValueError(f"{counter.name}: the energy counter went backwards ({last} -> {value} mJ)")
        if value != last:
            updates.append(Update(last_started, read_ended, value))
            last = value
        last_started = read_started
        if pause_s:
            time.sleep(pause_s)
    return updates


def fit_powers(updates: Sequence[Update], spans: Sequence[Span], items: int) -> PowerFit | Unavailable:
    """Each item's power from the counter's `updates` and the timing's `spans` (module docstring: the model).

    The spans are made contiguous (each runs from the previous one's end): the few microseconds of bookkeeping
    between blocks count to the block after them. Only intervals that lie inside the timing at every lag tried
    are used. Unavailable where there are too few of them for the items, where an item never ran in them, or where
    a fitted power is not positive."""
    if not spans:
        return Unavailable("the timing recorded no blocks")
    ordered = sorted(spans, key=lambda span: span.start_s)
    bounds = np.array([ordered[0].start_s] + [span.end_s for span in ordered])
    owner = np.array([span.item for span in ordered])
    # Time spent in each item up to each bound: the time_in step functions the design matrix is read from.
    time_in = np.zeros((items, len(bounds)))
    for index, item in enumerate(owner):
        time_in[:, index + 1] = time_in[:, index]
        time_in[item, index + 1] += bounds[index + 1] - bounds[index]
    changes = list(updates[1:])  # the first reading is no update
    if len(changes) < 2:
        return Unavailable(f"the energy counter changed {len(changes)} time(s) during the timing")
    at = np.array([update.at_s for update in changes])
    energy_j = np.diff(np.array([update.millijoules for update in changes], dtype=float)) / 1000
    period_s = float(statistics.median(np.diff(at)))
    lags = np.linspace(0.0, LAG_PERIODS * period_s, LAG_STEPS)
    inside = (at[:-1] - lags[-1] >= bounds[0]) & (at[1:] <= bounds[-1])
    intervals = int(inside.sum())
    needed = MIN_INTERVALS_PER_STEP * items + 1
    if intervals < needed:
        return Unavailable(
            f"the energy counter moved {intervals} time(s) inside the timing ({bounds[-1] - bounds[0]:.2f} s, updates "
            f"every {period_s * 1000:.0f} ms); fitting {items} steps needs {needed}"
        )
    starts, ends, target = at[:-1][inside], at[1:][inside], energy_j[inside]
    best: tuple[float, np.ndarray, float] | None = None
    for lag in lags:
        design = np.stack([np.interp(ends - lag, bounds, t) - np.interp(starts - lag, bounds, t) for t in time_in])
        if np.linalg.matrix_rank(design.T) < items:
            return Unavailable("some step never ran between two updates of the energy counter, so its power is unknown")
        power, *_ = np.linalg.lstsq(design.T, target, rcond=None)
        misfit = float(np.sum((design.T @ power - target) ** 2))
        if best is None or misfit < best[2]:
            best = (float(lag), power, misfit)
    assert best is not None
    lag, power, misfit = best
    if not all(value > 0 for value in power):
        return Unavailable(
            "the fitted power of some step was not positive: the counter's updates do not follow which step ran "
            "(a counter that averages its power over many updates)"
        )
    return PowerFit(
        power_w=tuple(float(value) for value in power),
        intervals=intervals,
        update_period_s=period_s,
        lag_s=lag,
        residual_pct=float(100 * np.sqrt(misfit / intervals) / np.mean(target)),
    )


class Poller:
    """The poller process for the counter `source` names (pipeline.profiling.energy.open_counter): started before
    the steps are built, so that its own start overlaps theirs; `stop` after the timing gives its updates."""

    def __init__(self, source: str) -> None:
        self._process = subprocess.Popen(
            [sys.executable, "-m", __name__, source],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=_PROJECT_ROOT,
        )

    def ready(self) -> str | Unavailable:
        """Wait until the poller reads the counter (its first line): the counter's name, or why it cannot be read."""
        assert self._process.stdout is not None
        line = self._process.stdout.readline().rstrip("\n")
        if line.startswith("ready "):
            return line.removeprefix("ready ")
        self.stop()
        return Unavailable(line.removeprefix("unavailable ") or "the energy counter's poller ended without a word")

    def stop(self) -> list[Update] | Unavailable:
        try:
            out, err = self._process.communicate(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.communicate()
            return Unavailable(f"the energy counter's poller did not stop within {STOP_TIMEOUT_S:.0f} s")
        try:
            answer = json.loads(out.strip().splitlines()[-1])
        except (IndexError, json.JSONDecodeError):
            return Unavailable(f"the energy counter's poller failed: {err.strip()[-500:] or 'no answer'}")
        if "unavailable" in answer:
            return Unavailable(str(answer["unavailable"]))
        return [Update(float(after), float(before), int(mj)) for after, before, mj in answer["updates"]]


def _stdin_closed() -> bool:
    readable, _, _ = select.select([sys.stdin], [], [], 0)
    return bool(readable) and not os.read(sys.stdin.fileno(), 4096)


def main() -> None:
    counter = open_counter(sys.argv[1])
    if isinstance(counter, Unavailable):
        print(f"unavailable {counter.reason}", flush=True)
        return
    print(f"ready {counter.name}", flush=True)
    try:
        updates = poll(counter, _stdin_closed)
    except Exception as error:  # an NVML error mid-way, a counter that went backwards: said, never a traceback
        print(json.dumps({"unavailable": f"{counter.name}: {error}"}), flush=True)
        return
    print(json.dumps({"updates": [[update.after_s, update.before_s, update.millijoules] for update in updates]}))


if __name__ == "__main__":
    main()
