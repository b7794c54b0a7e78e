"""Energy per step, from a device's energy counter read around windows of steps, and what the GPU ran at.

An energy counter (NVML's total-energy counter on a GPU, RAPL's package counters on a CPU) is not a continuous
integral: its value moves in steps, once per update period (NVML documents no period; it differs between GPUs and
drivers, so `measure_update_period` measures it by polling). A reading taken at time t is the energy up to some
instant in (t - period, t]. The energy between two readings is therefore off by less than one period's energy:
each reading lags the truth by less than a period, and the two lags enter with opposite signs. At steady power
that is a relative error below period / window.

`measure_energy` makes each window at least WINDOW_PERIODS update periods long, so one window's energy is within
1 / WINDOW_PERIODS = 5 % (twice that if the power at one end of the window were double the window's mean). The
windows run back to back and share their end readings, so the lags at the inner boundaries cancel in the total:
the energy per step over all windows is within period / (total time), 1 % for the default five windows. Aligning
the start on an update edge (wait for the value to change, then start) would remove the first reading's lag, but
only if the driver publishes the energy up to the moment of the update, which NVML does not document; the window
rule needs only that a reading lags by less than one period. A lead-in of steps before the first reading puts
that lag inside the step's own power, not in the idle time before it.

A counter that cannot be read, or that does not advance while steps run, is reported as `Unavailable` with a
one-sentence reason: never as zero energy.

Torch-free: the caller passes its step and its device synchronisation (pipeline.profiling.timing.synchronizer).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

from pipeline.devices.counters import EnergyCounter, Unavailable

WINDOW_PERIODS = 20  # a window is at least this many update periods: the counter's lag is <= 5 % of its energy
MIN_WINDOW_S = 0.1  # and at least this long, so a fast-updating counter (RAPL: ~1 ms) still averages many steps
LEAD_IN_PERIODS = 2  # steps run this many periods before the first reading, so its lag falls in busy time
WINDOWS = 5  # windows measured: their spread shows the variation, their total is within 1 / (5 x 20) = 1 %
UPDATE_PROBE_S = 1.0  # polling time of measure_update_period: many updates even of a slow counter (NVML's)
MIN_INTERVALS = 3  # update intervals measure_update_period needs to give a period
MAX_BOUND_RATIO = 1.5  # an upper bound on the period serves if at most this times the median interval seen
CLEAN_GAP_SHARE = 0.05  # an update interval counts if both its ends were timed to within this share of it


@dataclass(frozen=True)
class UpdatePeriod:
    """How often a counter's value moves: the intervals between consecutive changes seen while polling it.

    A change happened between two readings of the counter, so it is timed to within the two clock gaps around the
    poll that saw it; updates cannot hide between two changes seen, as any update in between would have been seen.
    Only intervals whose two ends were both timed to within CLEAN_GAP_SHARE of the interval count: a poller
    descheduled on a busy machine (a scheduler slice: milliseconds) sees a change late, or two updates as one, and
    would make the intervals come out wrong. A counter that changed at nearly every poll updates at least that often.

    Where fewer than MIN_INTERVALS were timed that cleanly, every interval seen still bounds the update interval it
    covers: a change lies within its poll's bracket, so the true interval is at most the one seen plus its less
    precise end's bracket. That holds whatever widened the brackets: a counter slow to read (NVML's on an H100,
    docs/measurements.md), or a poller kept off now and then. Then `bounded` is set
    and `longest_s` is the largest such bound, if it is at most MAX_BOUND_RATIO times the median interval seen: the
    windows of measure_energy come out longer than needed, never shorter. A bound wider than that would make them
    mostly waiting, so then there is no period.
    """

    median_s: float
    shortest_s: float
    longest_s: float  # the safe period for measure_energy's window rule
    intervals: int  # timed cleanly (all of them where `bounded`), of changes - 1
    changes: int
    polls: int
    seconds: float
    bounded: bool = False  # readings too slow to time an interval cleanly: longest_s is each interval's upper bound

    @property
    def poll_interval_s(self) -> float:
        return self.seconds / self.polls


def measure_update_period(
    counter: EnergyCounter, duration_s: float = UPDATE_PROBE_S, clock: Callable[[], float] = time.perf_counter
) -> UpdatePeriod | Unavailable:
    """Poll `counter` for `duration_s` and time its changes (UpdatePeriod: which intervals count). Polls without
    pause, as a pause would blur the times. Unavailable if it went backwards, if it changed too rarely, or if fewer
    than MIN_INTERVALS intervals were timed cleanly and the intervals seen bound the period only to more than
    MAX_BOUND_RATIO times their median."""
    started = clock()
    now = started
    last = counter.millijoules()
    polls = 1
    changes = 0
    gap = 0.0
    gaps: list[float] = []  # between consecutive readings: a reading's own time, plus any time descheduled
    changed_at: float | None = None
    last_bracket = 0.0  # how precisely the last change was timed
    spans: list[tuple[float, float]] = []  # (interval, the less precise of its ends)
    while now - started < duration_s:
        value = counter.millijoules()
        polled = clock()
        previous_gap = gap
        gap, now = polled - now, polled
        gaps.append(gap)
        polls += 1
        if value < last:
            return Unavailable(f"{counter.name}: the energy counter went backwards ({last} -> {value} mJ)")
        if value != last:
            changes += 1
            bracket = previous_gap + gap  # the change lies between the previous reading and this one
            if changed_at is not None:
                spans.append((now - changed_at, max(last_bracket, bracket)))
            changed_at, last_bracket, last = now, bracket, value
    seconds = now - started
    intervals = sorted(interval for interval, bracket in spans if bracket <= CLEAN_GAP_SHARE * interval)
    if len(intervals) >= MIN_INTERVALS:
        return UpdatePeriod(
            median_s=statistics.median(intervals),
            shortest_s=intervals[0],
            longest_s=intervals[-1],
            intervals=len(intervals),
            changes=changes,
            polls=polls,
            seconds=seconds,
        )
    if len(spans) < MIN_INTERVALS:
        return Unavailable(
            f"{counter.name}: the energy counter changed {changes} time(s) in {seconds:.2f} s of polling, too few "
            "to tell its update period (it is stuck, or updates less often than that)"
        )
    reading_s = statistics.median(gaps)
    typical_s = statistics.median(interval for interval, _ in spans)
    bound_s = max(interval + bracket for interval, bracket in spans)
    if bound_s <= MAX_BOUND_RATIO * typical_s:
        return UpdatePeriod(
            median_s=typical_s,
            shortest_s=min(interval for interval, _ in spans),
            longest_s=bound_s,
            intervals=len(spans),
            changes=changes,
            polls=polls,
            seconds=seconds,
            bounded=True,
        )
    longest_gap_s = max(gaps)  # a reading plus any time the poller was kept from running
    cause = "a busy machine" if longest_gap_s > 2 * reading_s else "a counter slow to read"
    return Unavailable(
        f"{counter.name}: only {len(intervals)} of the energy counter's {len(spans)} update intervals (median "
        f"{typical_s * 1000:.1f} ms) could be timed to within {CLEAN_GAP_SHARE * 100:.0f} % in {seconds:.2f} s of "
        f"polling, and they bound its update period only to {bound_s * 1000:.1f} ms, {bound_s / typical_s:.1f} "
        f"times their median: a reading took {reading_s * 1000:.3f} ms (median), and the longest gap between two "
        f"readings was {longest_gap_s * 1000:.1f} ms ({cause})"
    )


@dataclass(frozen=True)
class EnergyWindow:
    """Consecutive steps between two readings of the counter, the device synchronised before each."""

    steps: int
    seconds: float
    millijoules: int  # > 0: a window the counter did not advance over is never recorded

    @property
    def joules_per_step(self) -> float:
        return self.millijoules / 1000 / self.steps

    @property
    def power_w(self) -> float:
        return self.millijoules / 1000 / self.seconds


@dataclass(frozen=True)
class EnergyEstimate:
    """The energy of a step, from back-to-back windows of steps (module docstring: why the windows are so long)."""

    counter: str
    update_period_s: float
    windows: tuple[EnergyWindow, ...]

    @property
    def steps(self) -> int:
        return sum(window.steps for window in self.windows)

    @property
    def seconds(self) -> float:
        return sum(window.seconds for window in self.windows)

    @property
    def joules(self) -> float:
        return sum(window.millijoules for window in self.windows) / 1000

    @property
    def joules_per_step(self) -> float:
        """Over all windows: their shared readings cancel, so only the two outermost readings' lags remain."""
        return self.joules / self.steps

    @property
    def mean_power_w(self) -> float:
        return self.joules / self.seconds

    @property
    def window_joules_per_step(self) -> tuple[float, ...]:
        """Each window's own figure: their spread is the step's variation plus up to ±`window_error_pct` each."""
        return tuple(window.joules_per_step for window in self.windows)

    @property
    def window_error_pct(self) -> float:
        """The most one window's energy can be off by the counter's updates, in % at steady power."""
        return 100.0 * self.update_period_s / min(window.seconds for window in self.windows)

    @property
    def error_pct(self) -> float:
        """The most `joules_per_step` can be off by the counter's updates, in % at steady power."""
        return 100.0 * self.update_period_s / self.seconds


def measure_energy(
    step: Callable[[], None],
    sync: Callable[[], None],
    counter: EnergyCounter,
    period_s: float,
    windows: int = WINDOWS,
    min_steps: int = 1,
    min_window_s: float = MIN_WINDOW_S,
    clock: Callable[[], float] = time.perf_counter,
) -> EnergyEstimate | Unavailable:
    """The energy of `step` (warmed up) over `windows` back-to-back windows of at least `min_steps` steps and
    max(WINDOW_PERIODS x `period_s`, `min_window_s`) seconds each.

    `period_s` is the counter's update period: UpdatePeriod.longest_s, so that no interval seen is longer. `sync`
    waits for the device's queued work; it runs before every reading, so each window's steps have finished inside
    it. Unavailable, at once, if the counter does not advance over a window or goes backwards. Takes about
    windows x WINDOW_PERIODS + LEAD_IN_PERIODS update periods (2 s for a counter of 20 ms), or more for long steps.
    """
    if not (math.isfinite(period_s) and period_s > 0):
        raise ValueError(f"the counter's update period must be a positive number of seconds, not {period_s}")
    if windows < 1 or min_steps < 1:
        raise ValueError(f"need at least one window of at least one step, not {windows} of {min_steps}")
    window_s = max(WINDOW_PERIODS * period_s, min_window_s)

    def run(seconds: float, least: int) -> int:
        started = clock()
        steps = 0
        while steps < least or clock() - started < seconds:
            step()
            steps += 1
        return steps

    run(LEAD_IN_PERIODS * period_s, 1)
    sync()
    last_time = clock()
    last_mj = counter.millijoules()
    measured: list[EnergyWindow] = []
    for number in range(1, windows + 1):
        steps = run(window_s, min_steps)
        sync()
        now = clock()
        mj = counter.millijoules()
        if mj <= last_mj:
            what = "went backwards" if mj < last_mj else "did not advance"
            return Unavailable(
                f"{counter.name}: the energy counter {what} over {steps} steps in {now - last_time:.3f} s "
                f"(window {number} of {windows}, {(now - last_time) / period_s:.0f} update periods of {period_s} s): "
                "it is stuck, or updates less often than measured"
            )
        measured.append(EnergyWindow(steps=steps, seconds=now - last_time, millijoules=mj - last_mj))
        last_time, last_mj = now, mj
    return EnergyEstimate(counter=counter.name, update_period_s=period_s, windows=tuple(measured))
