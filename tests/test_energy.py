"""Energy counters: the update period, energy per step within the counter's quantization bound, RAPL, NVML."""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from pipeline.devices.counters import (
    RAPL_NOT_EXPOSED,
    EnergyCounter,
    GpuPowerState,
    NvmlCounter,
    RaplCounter,
    Unavailable,
    gpu_power_state,
    open_gpu_counter,
    rapl_counters,
)
from pipeline.profiling.energy import (
    MAX_BOUND_RATIO,
    WINDOW_PERIODS,
    EnergyEstimate,
    UpdatePeriod,
    measure_energy,
    measure_update_period,
)


class VirtualClock:
    """A clock that moves `tick` at each reading (the cost of a poll) and as far as a step says it took."""

    def __init__(self, start: float = 0.0, tick: float = 1e-6) -> None:
        self.now = start
        self.tick = tick

    def __call__(self) -> float:
        self.now += self.tick
        return self.now

    def busy(self, seconds: float) -> Callable[[], None]:
        def step() -> None:
            self.now += seconds

        return step


class SteppedCounter:
    """Counts as NVML's counter does: the energy at `power_w` up to the last multiple of `period_s` on `time_of`,
    so it moves by power x period at each update and stands still in between. From `stops_at` on it is stuck."""

    def __init__(
        self, time_of: Callable[[], float], period_s: float, power_w: float, stops_at: float = math.inf
    ) -> None:
        self.time_of = time_of
        self.period_s = period_s
        self.power_w = power_w
        self.stops_at = stops_at
        self.name = "stand-in"

    def millijoules(self) -> int:
        updates = math.floor(min(self.time_of(), self.stops_at) / self.period_s)
        return round(updates * self.period_s * self.power_w * 1000)


def busy_wait(seconds: float) -> Callable[[], None]:
    def step() -> None:
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    return step


def expect_estimate(result: EnergyEstimate | Unavailable) -> EnergyEstimate:
    assert isinstance(result, EnergyEstimate), result
    return result


def expect_period(result: UpdatePeriod | Unavailable) -> UpdatePeriod:
    assert isinstance(result, UpdatePeriod), result
    return result


def bound_that_serves(clock: VirtualClock, counter: SteppedCounter) -> UpdatePeriod:
    """The counter's period as measured on `clock`: an upper bound (no interval timed cleanly), at least the true
    period and within MAX_BOUND_RATIO of the median interval seen, whose windows give the counter's power."""
    period = expect_period(measure_update_period(counter, duration_s=1.0, clock=clock))
    assert period.bounded and counter.period_s <= period.longest_s <= MAX_BOUND_RATIO * period.median_s, period
    estimate = expect_estimate(
        measure_energy(clock.busy(0.002), lambda: None, counter, period.longest_s, windows=2, clock=clock)
    )
    assert estimate.mean_power_w == pytest.approx(counter.power_w, rel=0.06)
    return period


def test_all_counters_are_energy_counters() -> None:
    # Checked by mypy: each class has what measure_energy reads.
    counters: list[type[EnergyCounter]] = [SteppedCounter, NvmlCounter, RaplCounter]
    assert len(counters) == 3


# -- the update period -----------------------------------------------------------------------------------------


def test_update_period_is_found_on_a_virtual_clock() -> None:
    # Each change is seen at the first poll after it, less than a tick late: every interval is P within a tick.
    clock = VirtualClock(start=0.0123, tick=5e-5)
    counter = SteppedCounter(lambda: clock.now, period_s=0.02, power_w=250.0)
    period = expect_period(measure_update_period(counter, duration_s=1.0, clock=clock))
    assert period.median_s == pytest.approx(0.02, abs=2 * clock.tick)
    assert period.shortest_s == pytest.approx(0.02, abs=2 * clock.tick)
    assert period.longest_s == pytest.approx(0.02, abs=2 * clock.tick)
    assert 49 <= period.changes <= 51
    assert period.poll_interval_s == pytest.approx(clock.tick, rel=0.01)


def test_update_period_is_found_on_the_real_clock() -> None:
    # Only intervals whose ends were timed to within 5 % count, so the median is within 10 % even on a busy machine,
    # or the measurement says the machine was too busy: then this test cannot check anything. The stand-in's
    # updates are offset from whole milliseconds, where the kernel's scheduler ticks fall.
    counter = SteppedCounter(lambda: time.perf_counter() + 0.0013, period_s=0.01, power_w=100.0)
    result = measure_update_period(counter, duration_s=0.3)
    if isinstance(result, Unavailable):
        assert "busy machine" in result.reason
        pytest.skip(result.reason)
    assert result.median_s == pytest.approx(0.01, rel=0.1)
    assert result.intervals >= 3 and result.changes <= 31  # 30 updates in 0.3 s; fewer seen where merged
    assert result.shortest_s <= result.median_s <= result.longest_s


class DescheduledClock(VirtualClock):
    """A virtual clock of a poller that runs for `on_s`, then is kept off for `off_s`: a busy machine's time slices.

    Its readings jump over the off time, after the counter was read: a change during it is seen late."""

    def __init__(self, on_s: float, off_s: float, tick: float) -> None:
        super().__init__(tick=tick)
        self.on_s = on_s
        self.cycle_s = on_s + off_s

    def __call__(self) -> float:
        self.now += self.tick
        if self.now % self.cycle_s >= self.on_s:
            self.now += self.cycle_s - self.now % self.cycle_s
        return self.now


def test_update_period_ignores_changes_seen_late() -> None:
    # Half of the updates fall while the poller is off and are seen up to 4 ms late; counted, they would make
    # the longest interval 21 ms, and measure_energy's windows a fifth longer than needed.
    clock = DescheduledClock(on_s=0.004, off_s=0.004, tick=1e-5)
    counter = SteppedCounter(lambda: clock.now, period_s=0.0173, power_w=250.0)
    period = expect_period(measure_update_period(counter, duration_s=1.0, clock=clock))
    assert period.changes >= 56 and 3 <= period.intervals < period.changes - 10
    for seconds in (period.shortest_s, period.median_s, period.longest_s):
        assert seconds == pytest.approx(0.0173, abs=2 * clock.tick)


class UnevenClock(VirtualClock):
    """A virtual clock whose readings take each of `ticks` in turn, and whose poller is kept off for `off_s` once
    every `every_s`: a counter slow to read, on a machine that now and then runs something else."""

    def __init__(self, ticks: tuple[float, ...], off_s: float, every_s: float) -> None:
        super().__init__(tick=ticks[0])
        self.ticks = ticks
        self.readings = 0
        self.off_s = off_s
        self.every_s = every_s
        self.next_off = every_s

    def __call__(self) -> float:
        self.now += self.ticks[self.readings % len(self.ticks)]
        self.readings += 1
        if self.now >= self.next_off:
            self.now += self.off_s
            self.next_off += self.every_s
        return self.now


def test_a_counter_a_little_slow_to_read_on_a_machine_now_and_then_busy_gives_an_upper_bound() -> None:
    # NVML's counter on an H100 inside a timing process: readings of 2.42 ms (median; 2.5 % of its 99.7 ms
    # interval would be clean), some slower, and the poller kept off for up to 17.5 ms: no interval timed to 5 %.
    clock = UnevenClock(ticks=(0.00242, 0.00242, 0.0026), off_s=0.0151, every_s=0.13)
    period = bound_that_serves(clock, SteppedCounter(lambda: clock.now, period_s=0.0997, power_w=120.0))
    assert period.intervals == period.changes - 1 >= 8
    assert period.longest_s <= 0.0997 + 2 * (0.0151 + 2 * 0.0026)  # the true period plus two brackets


def test_a_poller_kept_off_most_of_the_time_still_bounds_the_period_from_above() -> None:
    # Fast readings, but the poller runs 1 ms in every 11: every change is seen up to 10 ms late, none cleanly.
    clock = DescheduledClock(on_s=0.001, off_s=0.010, tick=1e-5)
    bound_that_serves(clock, SteppedCounter(lambda: clock.now, period_s=0.0197, power_w=250.0))


def test_update_period_is_not_guessed_on_a_machine_too_busy_to_poll() -> None:
    # Fast readings, but the poller runs 1 ms in every 21: the intervals seen bound a 19.7 ms period only to about
    # twice their median, and windows that long would be mostly waiting.
    clock = DescheduledClock(on_s=0.001, off_s=0.020, tick=1e-5)
    counter = SteppedCounter(lambda: clock.now, period_s=0.0197, power_w=250.0)
    result = measure_update_period(counter, duration_s=1.0, clock=clock)
    assert isinstance(result, Unavailable), result
    assert "the longest gap between two readings was 20.0 ms (a busy machine)" in result.reason, result.reason
    assert re.search(r"a reading took 0\.010 ms \(median\)", result.reason), result.reason
    bound = re.search(r"only to (\d+\.\d) ms, ([\d.]+) times", result.reason)
    assert bound and float(bound[2]) > MAX_BOUND_RATIO and float(bound[1]) >= 19.7, result.reason


def test_a_counter_too_slow_to_read_for_a_useful_bound_is_named_slow_not_busy() -> None:
    # Every reading takes 30 ms of a 100 ms interval: the intervals seen bound it only to about 180 ms.
    clock = VirtualClock(start=0.0371, tick=0.03)
    counter = SteppedCounter(lambda: clock.now, period_s=0.1, power_w=300.0)
    result = measure_update_period(counter, duration_s=1.5, clock=clock)
    assert isinstance(result, Unavailable), result
    assert "(a counter slow to read)" in result.reason and "busy" not in result.reason, result.reason
    assert "a reading took 30.000 ms (median), and the longest gap between two readings was 30.0 ms" in result.reason


@pytest.mark.parametrize("reading_s", [0.004, 0.0113])
def test_a_counter_slow_to_read_gives_an_upper_bound_on_its_update_period(reading_s: float) -> None:
    # Every reading takes milliseconds, as NVML's energy counter on an H100 (10 changes a second, none of its
    # intervals timed to 5 %): each interval seen bounds the true one from above by its ends' brackets.
    clock = VirtualClock(start=0.0371, tick=reading_s)
    period = bound_that_serves(clock, SteppedCounter(lambda: clock.now, period_s=0.1, power_w=300.0))
    assert period.intervals == period.changes - 1 >= 8
    assert period.median_s == pytest.approx(0.1, abs=2 * reading_s)
    assert period.longest_s <= 0.1 + 4 * reading_s
    assert period.poll_interval_s == pytest.approx(reading_s, rel=0.02)


@pytest.mark.parametrize(("power_w", "changes"), [(0.0, 0), (1.0, 1)])
def test_update_period_is_not_invented_from_too_few_changes(power_w: float, changes: int) -> None:
    clock = VirtualClock(start=0.1, tick=1e-4)
    counter = SteppedCounter(lambda: clock.now, period_s=0.6, power_w=power_w)  # one update (at 0.6 s) in 1 s
    result = measure_update_period(counter, duration_s=1.0, clock=clock)
    assert isinstance(result, Unavailable)
    assert f"changed {changes} time(s)" in result.reason and "stand-in" in result.reason


# -- energy per step -------------------------------------------------------------------------------------------


@pytest.mark.parametrize("start", [0.0, 0.0071, 0.0133, 1.2345])
def test_energy_per_step_is_within_the_quantization_bound(start: float) -> None:
    # The stand-in's reading lags the true energy by less than one period, so each window's energy is within
    # power x period of the truth (at most `window_error_pct` %), and the total within the same amount.
    power_w, period_s, step_s = 250.0, 0.02, 0.0037  # a step that does not divide the period: the phase varies
    clock = VirtualClock(start=start)
    counter = SteppedCounter(lambda: clock.now, period_s, power_w)
    syncs: list[float] = []
    estimate = expect_estimate(
        measure_energy(clock.busy(step_s), lambda: syncs.append(clock.now), counter, period_s, clock=clock)
    )
    assert len(estimate.windows) == 5 and len(syncs) == 6  # one sync before each reading
    assert all(window.seconds >= WINDOW_PERIODS * period_s for window in estimate.windows)
    assert estimate.window_error_pct <= 100 / WINDOW_PERIODS and estimate.error_pct <= 100 / (5 * WINDOW_PERIODS)
    for window in estimate.windows:
        true_j = power_w * window.seconds
        assert abs(window.millijoules / 1000 - true_j) <= power_w * period_s
        assert abs(window.joules_per_step / (power_w * step_s) - 1) <= estimate.window_error_pct / 100 + 0.001
    assert abs(estimate.joules - power_w * estimate.seconds) <= power_w * period_s
    assert estimate.mean_power_w == pytest.approx(power_w, rel=estimate.error_pct / 100)
    assert estimate.joules_per_step == pytest.approx(power_w * step_s, rel=estimate.error_pct / 100 + 0.001)
    assert estimate.window_joules_per_step == tuple(window.joules_per_step for window in estimate.windows)


def test_windows_quantization_shows_in_their_spread() -> None:
    # Windows of 20.5 periods: each window's energy is 20 or 21 updates, so the windows disagree by ~5 %,
    # while their total is still within 1 %.
    power_w, period_s, step_s = 100.0, 0.02, 0.41
    clock = VirtualClock(start=0.005, tick=0.0)
    counter = SteppedCounter(lambda: clock.now, period_s, power_w)
    estimate = expect_estimate(measure_energy(clock.busy(step_s), lambda: None, counter, period_s, clock=clock))
    per_step = estimate.window_joules_per_step
    assert (max(per_step) - min(per_step)) / (power_w * step_s) == pytest.approx(1 / 20.5, rel=0.01)
    assert estimate.joules_per_step == pytest.approx(power_w * step_s, rel=estimate.error_pct / 100)


def test_sync_makes_a_window_cover_the_queued_work() -> None:
    # A device step: launching it takes 0.1 ms of host time, running it 3.7 ms of device time. Only the sync
    # before each reading makes the window's steps finish inside it; without it, the energy per step would be
    # the energy of a launch.
    power_w, period_s, host_s, device_s = 300.0, 0.02, 0.0001, 0.0037
    clock = VirtualClock(tick=0.0)
    device_free_at = 0.0

    def launch() -> None:
        nonlocal device_free_at
        clock.now += host_s
        device_free_at = max(device_free_at, clock.now) + device_s

    def sync() -> None:
        clock.now = max(clock.now, device_free_at)

    counter = SteppedCounter(lambda: clock.now, period_s, power_w)
    estimate = expect_estimate(measure_energy(launch, sync, counter, period_s, clock=clock))
    assert estimate.joules_per_step == pytest.approx(power_w * device_s, rel=estimate.error_pct / 100 + 0.001)


def test_first_reading_lags_into_busy_time_only() -> None:
    # A reading is the energy up to less than one period before it: taken a period or more after the first step,
    # it does not reach back into the idle time before the steps (which would make the first window low).
    period_s = 0.02
    clock = VirtualClock(start=3.0, tick=0.0)
    counter = SteppedCounter(lambda: clock.now, period_s, 100.0)
    read_at: list[float] = []
    step_at: list[float] = []
    advance = clock.busy(0.0037)

    class Logged:
        name = counter.name

        def millijoules(self) -> int:
            read_at.append(clock.now)
            return counter.millijoules()

    def step() -> None:
        step_at.append(clock.now)
        advance()

    expect_estimate(measure_energy(step, lambda: None, Logged(), period_s, clock=clock))
    assert read_at[0] - step_at[0] >= period_s


def test_energy_on_the_real_clock_with_a_busy_wait_step() -> None:
    # The stand-in reads the clock measure_energy reads, so the bound holds exactly however noisy the machine:
    # a descheduled step only makes a window longer, and its energy with it.
    power_w, period_s, step_s = 100.0, 0.005, 0.002
    counter = SteppedCounter(time.perf_counter, period_s, power_w)
    estimate = expect_estimate(measure_energy(busy_wait(step_s), lambda: None, counter, period_s, windows=3))
    for window in estimate.windows:
        assert window.seconds >= 0.1  # MIN_WINDOW_S: 20 periods of 5 ms would be shorter
        assert abs(window.millijoules / 1000 - power_w * window.seconds) <= power_w * period_s + 0.001
        assert window.joules_per_step >= power_w * step_s * (1 - estimate.window_error_pct / 100)
    assert estimate.mean_power_w == pytest.approx(power_w, rel=estimate.error_pct / 100 + 0.001)


@pytest.mark.parametrize("stops_at", [0.0, 0.3])
def test_a_counter_that_stops_advancing_gives_no_energy(stops_at: float) -> None:
    # Stuck from the start, or after the first window: either way no figure, and never 0 J.
    clock = VirtualClock(tick=0.0)
    counter = SteppedCounter(lambda: clock.now, period_s=0.02, power_w=200.0, stops_at=stops_at)
    result = measure_energy(clock.busy(0.005), lambda: None, counter, 0.02, clock=clock)
    assert isinstance(result, Unavailable)
    assert "did not advance" in result.reason and "stand-in" in result.reason


def test_a_counter_that_goes_backwards_gives_no_energy() -> None:
    values = iter([5000, 4000])
    clock = VirtualClock(tick=0.0)

    class Reset:
        name = "reloaded driver"

        def millijoules(self) -> int:
            return next(values)

    result = measure_energy(clock.busy(0.005), lambda: None, Reset(), 0.02, clock=clock)
    assert isinstance(result, Unavailable) and "went backwards" in result.reason


@pytest.mark.parametrize("period_s", [0.0, -0.02, math.nan, math.inf])
def test_energy_needs_a_real_update_period(period_s: float) -> None:
    clock = VirtualClock()
    counter = SteppedCounter(lambda: clock.now, 0.02, 100.0)
    with pytest.raises(ValueError, match="update period"):
        measure_energy(clock.busy(0.01), lambda: None, counter, period_s, clock=clock)


# -- RAPL ------------------------------------------------------------------------------------------------------


def rapl_zone(root: Path, zone: str, name: str, energy_uj: int = 1_000_000, max_uj: int = 262_143_328_850) -> Path:
    path = root / zone
    path.mkdir(parents=True)
    (path / "name").write_text(f"{name}\n")
    (path / "energy_uj").write_text(f"{energy_uj}\n")
    (path / "max_energy_range_uj").write_text(f"{max_uj}\n")
    return path


def test_rapl_counts_the_packages_only(tmp_path: Path) -> None:
    rapl_zone(tmp_path, "intel-rapl:0", "package-0", energy_uj=5_000_999)
    rapl_zone(tmp_path, "intel-rapl:0/intel-rapl:0:0", "core")  # a part of package 0
    rapl_zone(tmp_path, "intel-rapl:1", "psys")  # the whole platform, packages included
    rapl_zone(tmp_path, "intel-rapl:10", "package-10")
    rapl_zone(tmp_path, "intel-rapl:2", "package-1")
    rapl_zone(tmp_path, "intel-rapl-mmio:0", "package-0")  # the same package through another interface
    (tmp_path / "intel-rapl").mkdir()  # the control type: no counter
    counters = rapl_counters(tmp_path)
    assert isinstance(counters, list)
    assert [counter.name for counter in counters] == ["package-0", "package-1", "package-10"]
    assert counters[0].millijoules() == 5_000  # µJ -> mJ


def test_rapl_counter_increases_across_the_wrap_around(tmp_path: Path) -> None:
    zone = rapl_zone(tmp_path, "intel-rapl:0", "package-0", energy_uj=999_000, max_uj=1_000_000)
    counters = rapl_counters(tmp_path)
    assert isinstance(counters, list)
    counter = counters[0]
    readings = [counter.millijoules()]
    for raw_uj in (999_800, 500, 2_500, 2_500, 999_999, 1_000):
        (zone / "energy_uj").write_text(f"{raw_uj}\n")
        readings.append(counter.millijoules())
    assert readings == [999, 999, 1_000, 1_002, 1_002, 1_999, 2_001]


def test_rapl_missing_is_not_exposed(tmp_path: Path) -> None:
    assert rapl_counters(tmp_path / "powercap") == Unavailable(RAPL_NOT_EXPOSED)
    assert rapl_counters(tmp_path) == Unavailable(RAPL_NOT_EXPOSED)  # a powercap folder without RAPL zones
    assert RAPL_NOT_EXPOSED == "not exposed by this machine"


def test_rapl_unreadable_counter_is_reported_not_raised(tmp_path: Path) -> None:
    # A directory in place of energy_uj fails open() even for root, as a denied read does for others.
    zone = rapl_zone(tmp_path, "intel-rapl:0", "package-0")
    (zone / "energy_uj").unlink()
    (zone / "energy_uj").mkdir()
    result = rapl_counters(tmp_path)
    assert isinstance(result, Unavailable)
    assert result.reason.startswith("not readable (") and result.reason.endswith("intel-rapl:0/energy_uj")


def test_rapl_one_unreadable_package_gives_no_sum(tmp_path: Path) -> None:
    rapl_zone(tmp_path, "intel-rapl:0", "package-0")
    (rapl_zone(tmp_path, "intel-rapl:1", "package-1") / "energy_uj").write_text("garbage\n")
    result = rapl_counters(tmp_path)
    assert isinstance(result, Unavailable) and "not a number: 'garbage'" in result.reason


def test_rapl_on_this_machine_never_raises() -> None:
    result = rapl_counters()
    assert isinstance(result, Unavailable) or all(counter.millijoules() >= 0 for counter in result)


# -- NVML ------------------------------------------------------------------------------------------------------


def test_gpu_counter_is_a_counter_or_a_reason() -> None:
    # Without an NVIDIA driver (this lab's CPU machines): NVML cannot be loaded, and that is said, not raised.
    counter = open_gpu_counter(0)
    if isinstance(counter, Unavailable):
        assert "NVML" in counter.reason
        return
    with counter:
        first = counter.millijoules()
        assert first > 0 and counter.millijoules() >= first and "GPU 0" in counter.name


def test_no_such_gpu_is_a_reason() -> None:
    assert isinstance(open_gpu_counter(999), Unavailable)
    state = gpu_power_state(999)
    assert isinstance(state, Unavailable) and "NVML" in state.reason


def test_gpu_power_state_is_a_state_or_a_reason() -> None:
    state = gpu_power_state(0)
    if isinstance(state, Unavailable):
        assert "NVML" in state.reason
        return
    assert isinstance(state, GpuPowerState) and state.name and state.driver_version
    assert state.power_limit_w is None or state.power_limit_w > 0


def test_gpu_counter_update_period_on_a_gpu() -> None:
    counter = open_gpu_counter(0)
    if isinstance(counter, Unavailable):
        pytest.skip(counter.reason)
    with counter:
        result = measure_update_period(counter)
    assert not isinstance(result, Unavailable), result.reason  # an idle GPU machine: a period or its bound
    assert 0 < result.median_s <= result.longest_s < 0.3  # at least three intervals in the second polled
