"""Timing statistics on synthetic timings from known distributions, and the measurement conditions."""

from __future__ import annotations

import math
import os
import random
from pathlib import Path

import pytest
from scipy.stats import binom, t  # type: ignore[import-untyped]  # no stubs; an independent oracle

from pipeline.records.profile import Timing
from pipeline.records.quantities import GOVERNOR_NOT_EXPOSED, Interval, MeasurementConditions, StepEstimate
from pipeline.records.roofs import SpeedDrift
from pipeline.records.statistics import (
    PROCESSES_DISAGREE_ADVICE,
    Block,
    available_cores,
    between_process_interval,
    cpu_governor,
    cpu_pressure,
    estimate_over_processes,
    estimate_step_time,
    load_average,
    measurement_conditions,
    median_interval,
    paired_ratio,
    prediction_interval,
    ratio_over_pairs,
    t_975,
    two_speeds,
)

# What a Timing record needs beyond the estimate (not under test here).
_REST = {"steps_per_block": 1, "timing_s": 1.0, "peak_memory_mb": 0.0, "top_operator_share_pct": 0.0}


def _lognormal_blocks(rng: random.Random, n: int, median_ms: float, sigma: float, steps: int = 1) -> list[Block]:
    """`n` blocks whose per-step time is lognormal with the given median (exp(mu)) and log-spread."""
    mu = math.log(median_ms)
    return [Block(steps, steps * rng.lognormvariate(mu, sigma) / 1000) for _ in range(n)]


@pytest.mark.parametrize("n", [6, 7, 10, 20, 50, 101, 1000])
def test_median_interval_uses_the_exact_binomial_order_statistics(n: int) -> None:
    values = [float(v) for v in range(n)]
    low, high = median_interval(values) or (None, None)
    # The largest j with P(Binomial(n, 1/2) <= j - 1) <= 2.5 %, from scipy as an independent oracle.
    j = max(k for k in range(1, n // 2 + 1) if binom.cdf(k - 1, n, 0.5) <= 0.025)
    assert (low, high) == (values[j - 1], values[n - j])
    assert 1 - 2 * binom.cdf(j - 1, n, 0.5) >= 0.95


def test_median_interval_needs_six_values_at_95_percent() -> None:
    assert median_interval([1.0, 2.0, 3.0, 4.0, 5.0]) is None  # [min, max] of 5 covers only 93.75 %
    assert median_interval([5.0, 1.0, 4.0, 2.0, 6.0, 3.0]) == (1.0, 6.0)  # unsorted input is fine
    with pytest.raises(ValueError, match="confidence"):
        median_interval([1.0] * 10, confidence=1.0)


@pytest.mark.parametrize(("n", "sigma"), [(20, 0.3), (60, 0.1), (200, 0.5)])
def test_interval_covers_the_true_median_at_about_the_nominal_rate(n: int, sigma: float) -> None:
    """Skewed (lognormal) block times with a known median: the 95 % interval covers it ~95-98 % of the time."""
    true_median = 7.0
    trials = 1500
    covered = 0
    for seed in range(trials):
        estimate = estimate_step_time(_lognormal_blocks(random.Random(seed), n, true_median, sigma), 64, 2.0)
        covered += estimate.ci_low_ms <= true_median <= estimate.ci_high_ms
    j = max(k for k in range(1, n // 2 + 1) if binom.cdf(k - 1, n, 0.5) <= 0.025)
    exact = 1 - 2 * binom.cdf(j - 1, n, 0.5)  # what order statistics guarantee for continuous iid data
    standard_error = math.sqrt(exact * (1 - exact) / trials)
    assert abs(covered / trials - exact) < 4 * standard_error, (covered / trials, exact)
    assert covered / trials > 0.94


def test_six_or_more_processes_get_the_order_statistic_interval_of_their_medians() -> None:
    medians = [3.1, 2.9, 3.6, 3.0, 3.3, 2.8, 3.2]
    assert between_process_interval(medians) == median_interval(medians) == (2.8, 3.6)


def test_two_to_five_processes_get_students_t_on_the_logarithms() -> None:
    medians = [10.0, 12.0, 11.0]
    logs = [math.log(value) for value in medians]
    mean = sum(logs) / 3
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 2)
    half = t.ppf(0.975, 2) * sd / math.sqrt(3)  # scipy as the oracle for the quantile the module hard-codes
    low, high = between_process_interval(medians) or (0.0, 0.0)
    assert low == pytest.approx(math.exp(mean - half), rel=1e-4) and high == pytest.approx(
        math.exp(mean + half), rel=1e-4
    )
    assert between_process_interval([5.0]) is None  # one process bounds nothing between processes
    for k in range(2, 6):
        value = between_process_interval([1.0 + i / 10 for i in range(k)])
        assert value is not None and value[0] <= 1.0 + (k - 1) / 20 <= value[1]


@pytest.mark.parametrize("k", [2, 3, 4, 5, 6, 8])
def test_process_interval_covers_the_true_step_time_at_the_nominal_rate(k: int) -> None:
    """Processes that settle at lognormally spread speeds (as reruns on a small VM are): the interval from
    k processes covers the true median about 95 % of the time (t on logs is exact for lognormal medians)."""
    trials, covered = 2000, 0
    for seed in range(trials):
        rng = random.Random(seed)
        medians = [rng.lognormvariate(math.log(4.0), 0.2) for _ in range(k)]
        low, high = between_process_interval(medians) or (0.0, 0.0)
        covered += low <= 4.0 <= high
    assert 0.93 < covered / trials < 0.995, covered / trials


@pytest.mark.parametrize("k", [2, 3, 6, 10])
def test_one_more_process_falls_inside_the_prediction_interval_at_the_nominal_rate(k: int) -> None:
    """The trace check's reference: where a process like the timing ones would run. From k lognormal process medians,
    one more process lands inside about 95 % of the time, where the interval of the median (what a row states) would
    hold it far less often."""
    trials, inside, inside_median_interval = 2000, 0, 0
    for seed in range(trials):
        rng = random.Random(seed)
        medians = [rng.lognormvariate(math.log(4.0), 0.05) for _ in range(k)]
        one_more = rng.lognormvariate(math.log(4.0), 0.05)
        low, high = prediction_interval(medians) or (0.0, 0.0)
        inside += low <= one_more <= high
        low, high = between_process_interval(medians) or (0.0, 0.0)
        inside_median_interval += low <= one_more <= high
    assert 0.93 < inside / trials < 0.97, inside / trials
    if k >= 6:
        assert inside_median_interval / trials < 0.8, inside_median_interval / trials
    logs = [math.log(v) for v in (4.0, 4.2, 3.9)]
    mean, sd = sum(logs) / 3, math.sqrt(sum((x - sum(logs) / 3) ** 2 for x in logs) / 2)
    half = t.ppf(0.975, 2) * sd * math.sqrt(1 + 1 / 3)
    expected = (math.exp(mean - half), math.exp(mean + half))
    assert prediction_interval([4.0, 4.2, 3.9]) == pytest.approx(expected, rel=1e-3)  # t hard-coded to 4 digits
    assert prediction_interval([4.0]) is None and prediction_interval([4.0, 0.0]) is None


def test_estimate_over_processes_is_the_median_of_the_process_medians() -> None:
    rng = random.Random(3)
    processes = [_lognormal_blocks(rng, 30, median, 0.02) for median in (4.0, 5.0, 4.4, 6.0, 4.2, 4.6)]
    estimate = estimate_over_processes(processes, 16, 2.0)
    medians = sorted(estimate_step_time(blocks, 16, 2.0).median_ms for blocks in processes)
    assert estimate.median_ms == pytest.approx((medians[2] + medians[3]) / 2)
    assert (estimate.ci_low_ms, estimate.ci_high_ms) == (medians[0], medians[-1])  # six: [min, max]
    assert estimate.processes == 6 and estimate.blocks == 180 and estimate.noisy  # 4-6 ms is not ±2 %
    # Each process's blocks are tight (±2 %), yet the stated interval is the spread between processes.
    assert estimate_step_time(processes[0], 16, 2.0).ci_half_width_pct < 2 < estimate.ci_half_width_pct
    alone = estimate_over_processes(processes[:1], 16, 2.0)
    assert alone == estimate_step_time(processes[0], 16, 2.0) and alone.processes == 1
    with pytest.raises(ValueError, match="every process"):
        estimate_over_processes([processes[0], []], 16, 2.0)


def test_noisy_flag_fires_exactly_when_the_interval_misses_the_target() -> None:
    rng = random.Random(1)
    tight = estimate_step_time(_lognormal_blocks(rng, 400, 5.0, 0.05), 16, 2.0)
    assert (
        tight.ci_half_width_pct < 2.0
        and not tight.noisy
        and Timing.from_estimate(tight, **_REST).as_metrics()["noisy"] == 0.0
    )
    wide = estimate_step_time(_lognormal_blocks(rng, 30, 5.0, 0.5), 16, 2.0)
    assert (
        wide.ci_half_width_pct > 2.0 and wide.noisy and Timing.from_estimate(wide, **_REST).as_metrics()["noisy"] == 1.0
    )
    # The same blocks pass a looser target: the flag is about the target, not the data alone.
    assert not estimate_step_time(_lognormal_blocks(random.Random(1), 30, 5.0, 0.5), 16, 50.0).noisy
    # The interval narrows with more blocks (~1/sqrt(n)): 16x the blocks, about a quarter of the width.
    few = estimate_step_time(_lognormal_blocks(random.Random(2), 100, 5.0, 0.2), 16, 2.0)
    many = estimate_step_time(_lognormal_blocks(random.Random(2), 1600, 5.0, 0.2), 16, 2.0)
    assert 0.15 < many.ci_half_width_pct / few.ci_half_width_pct < 0.4


def test_too_few_blocks_give_a_finite_plus_minus_100_percent_interval_and_a_flag() -> None:
    estimate = estimate_step_time([Block(1, 0.010), Block(1, 0.012), Block(1, 0.011)], 1, 50.0)
    assert estimate.ci_low_ms == 0.0 and estimate.ci_high_ms == pytest.approx(22.0)
    assert estimate.ci_half_width_pct == pytest.approx(100.0) and estimate.noisy
    assert all(math.isfinite(value) for value in Timing.from_estimate(estimate, **_REST).as_metrics().values())


def test_estimate_fields_from_known_blocks() -> None:
    # Per-step times 1..9 ms in blocks of 4 steps: median 5, inclusive quartiles 3 and 7.
    blocks = [Block(4, 4 * ms / 1000) for ms in (9, 1, 8, 2, 7, 3, 6, 4, 5)]
    estimate = estimate_step_time(blocks, 8, 2.0)
    metrics = Timing.from_estimate(estimate, **_REST).as_metrics()
    assert metrics["step_time_ms_median"] == pytest.approx(5.0)
    assert metrics["step_time_ms_iqr"] == pytest.approx(4.0)
    assert metrics["step_time_ms_ci_low"] == pytest.approx(2.0) and metrics["step_time_ms_ci_high"] == pytest.approx(
        8.0
    )
    assert metrics["step_time_ci_pct"] == pytest.approx(60.0)  # the larger side: (8 - 5) / 5
    assert metrics["steps_measured"] == 36 and metrics["blocks_measured"] == 9
    assert metrics["per_sample_ms"] == pytest.approx(5.0 / 8)
    assert metrics["throughput_samples_per_s"] == pytest.approx(1600.0)
    assert estimate.per_sample.low == pytest.approx(2.0 / 8)
    with pytest.raises(ValueError, match="no timed blocks"):
        estimate_step_time([], 8, 2.0)


def test_ratio_interval_and_no_measurable_difference_wording() -> None:
    cpu, gpu = Interval(10.0, 9.5, 10.5), Interval(2.0, 1.9, 2.1)
    speedup = cpu / gpu
    assert speedup.value == 5.0
    assert speedup.low == pytest.approx(9.5 / 2.1) and speedup.high == pytest.approx(10.5 / 1.9)
    assert speedup.measurable and speedup.with_interval() == "5.00x (4.52-5.53x)"
    close = Interval(10.0, 9.6, 10.4) / Interval(10.2, 10.0, 10.5)
    assert not close.measurable
    assert close.with_interval() == "0.98x; the data cannot tell them apart (0.91-1.04x)"
    unbounded = Interval(10.0, 0.0, 20.0) / gpu  # too few blocks on one side
    assert not unbounded.measurable and "too few timed blocks" in unbounded.with_interval()


def test_ratio_is_measurable_exactly_when_the_intervals_do_not_overlap() -> None:
    rng = random.Random(3)
    for _ in range(2000):
        a_low, b_low = rng.uniform(1, 3), rng.uniform(1, 3)
        a = Interval(a_low + 0.1, a_low, a_low + rng.uniform(0.2, 1))
        b = Interval(b_low + 0.1, b_low, b_low + rng.uniform(0.2, 1))
        assert (a / b).measurable == (not a.overlaps(b))
        assert (a / b).low <= a.value / b.value <= (a / b).high


def test_per_sample_ratio_batch_1_vs_64_scales_the_intervals() -> None:
    batch_1 = estimate_step_time(_lognormal_blocks(random.Random(4), 200, 0.5, 0.05), 1, 2.0)
    batch_64 = estimate_step_time(_lognormal_blocks(random.Random(5), 200, 8.0, 0.05), 64, 2.0)
    cheaper = batch_1.per_sample / batch_64.per_sample
    assert cheaper.value == pytest.approx((0.5 / 1) / (8.0 / 64), rel=0.05)  # ~4x cheaper per sample at 64
    assert cheaper.measurable and cheaper.low < cheaper.value < cheaper.high


def test_conditions_are_read_on_this_machine() -> None:
    conditions = measurement_conditions(load_average(), threads=2)
    assert conditions.load_average_before >= 0 and conditions.load_average_after >= 0
    assert conditions.cores == available_cores() == len(os.sched_getaffinity(0))
    assert conditions.threads == 2
    governor = Path("/sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
    assert conditions.cpu_governor == (governor.read_text().strip() if governor.exists() else GOVERNOR_NOT_EXPOSED)
    pressure = Path("/proc/pressure/cpu")
    assert (cpu_pressure() is None) == (not pressure.exists())


def test_governor_and_pressure_files_are_parsed_and_absence_is_none(tmp_path: Path) -> None:
    governor = tmp_path / "scaling_governor"
    governor.write_text("performance\n")
    assert cpu_governor(governor) == "performance"
    assert cpu_governor(tmp_path / "absent") is None
    pressure = tmp_path / "cpu"
    pressure.write_text("some avg10=12.50 avg60=3.00 avg300=1.00 total=9874533\nfull avg10=0.00 avg60=0.00\n")
    assert cpu_pressure(pressure) == 12.5
    assert cpu_pressure(tmp_path / "absent") is None


def test_busy_flag_and_warning_when_load_exceeds_the_cores() -> None:
    quiet = MeasurementConditions(1.2, 1.9, cores=2, threads=2, cpu_governor=GOVERNOR_NOT_EXPOSED)
    assert not quiet.busy and quiet.warning() is None and quiet.as_metrics()["machine_busy"] == 0.0
    busy = MeasurementConditions(1.5, 3.1, cores=2, threads=2, cpu_governor="performance")
    assert busy.busy and busy.as_metrics()["machine_busy"] == 1.0
    warning = busy.warning()
    assert warning is not None and "load average 1.50 before, 3.10 after, on 2 cores" in warning
    assert "rerun on a quiet machine" in warning and "rerun on a quiet machine" in PROCESSES_DISAGREE_ADVICE


def test_hard_coded_t_quantiles_are_scipys() -> None:
    for degrees in range(1, 31):
        assert t_975(degrees) == pytest.approx(t.ppf(0.975, degrees), abs=1e-3), degrees
    assert t_975(500) == pytest.approx(t.ppf(0.975, 500), rel=0.01)  # beyond the table: the normal's 1.96
    with pytest.raises(ValueError, match="degrees of freedom"):
        t_975(0)


def _estimate(low: float, median: float, high: float) -> StepEstimate:
    return StepEstimate(
        batch_size=4, median_ms=median, iqr_ms=1.0, ci_low_ms=low, ci_high_ms=high, steps=60, blocks=12,
        ci_target_pct=2.0, processes=6,
    )  # fmt: skip


def test_speed_drift_is_a_prediction_interval_of_one_more_window() -> None:
    drift = SpeedDrift(window_s=4.0, window_medians_ms=(1.0, 1.1, 0.9, 1.0), workload="w")
    logs = [math.log(v) for v in (1.0, 1.1, 0.9, 1.0)]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    assert drift.spread_pct == pytest.approx(100 * sd)
    assert drift.half_width_pct == pytest.approx(100 * math.expm1(t.ppf(0.975, 3) * sd * math.sqrt(1.25)), rel=1e-3)
    assert drift.method == "w, its median time in each of 4 consecutive 4-s windows (spread 8.2 %)"
    assert SpeedDrift(0.0, (), "w").half_width_pct == 0.0  # not measured (profile.drift_probe_s: 0)


def _paired_processes(
    rng: random.Random, processes: int, rounds: int, ratio: float, drift: float, jitter: float
) -> tuple[list[list[Block]], list[list[Block]]]:
    """Two steps timed interleaved: every round the machine runs at a speed that drifts (log-normal random walk,
    `drift` per round), and each block adds its own `jitter`; b takes `ratio` x a's time."""
    a_side, b_side = [], []
    for _ in range(processes):
        speed, a_blocks, b_blocks = rng.gauss(0.0, 0.12), [], []  # each process meets the machine at its own speed
        for _ in range(rounds):
            speed += rng.gauss(0.0, drift)
            a_blocks.append(Block(1, math.exp(math.log(0.004) + speed + rng.gauss(0.0, jitter))))
            b_blocks.append(Block(1, math.exp(math.log(0.004 * ratio) + speed + rng.gauss(0.0, jitter))))
        a_side.append(a_blocks)
        b_side.append(b_blocks)
    return a_side, b_side


def test_a_paired_ratio_cancels_the_machines_drift_that_unpaired_intervals_carry_twice() -> None:
    """The case of the Zen 5 report: batch 64 is 7 % dearer per sample than batch 16 in every process, while the
    machine's speed moves 12 % between processes. Each row's interval (from the processes' spread) is wide and the
    two overlap, so a ratio of the two intervals cannot decide; the paired ratio, taken round by round in the same
    processes, sees the 7 % in every process and excludes 1."""
    rng = random.Random(30)
    batch16, batch64 = _paired_processes(rng, processes=6, rounds=40, ratio=1.07, drift=0.01, jitter=0.02)
    paired = paired_ratio(batch64, batch16)
    assert paired.value == pytest.approx(1.07, rel=0.01)
    assert paired.low > 1.0 and paired.measurable and paired.every_process
    assert paired.half_width_pct < 3.0
    unpaired = estimate_over_processes(batch64, 64, 2.0).interval / estimate_over_processes(batch16, 64, 2.0).interval
    assert not unpaired.measurable  # the same data, read as two unpaired rows: "the data cannot tell them apart"


def test_paired_ratio_per_sample_scale_and_its_refusals() -> None:
    a = [[Block(2, 0.010), Block(2, 0.012)]]
    b = [[Block(1, 0.001), Block(1, 0.0012)]]
    # One process: the interval of its rounds' ratios (too few for one here); per-step ratio 5 and 5, x 1/16.
    one = paired_ratio(a, b, scale=1 / 16)
    assert one.value == pytest.approx(5 / 16) and one.process_values == (pytest.approx(5 / 16),)
    assert one.low == 0.0 and math.isinf(one.high) and not one.measurable
    with pytest.raises(ValueError, match="same processes"):
        paired_ratio(a, b + b)
    with pytest.raises(ValueError, match="one block of each side in every round"):
        paired_ratio(a, [[Block(1, 0.001)]])


def test_a_ratio_over_pairs_of_processes_follows_the_pairs_not_the_minutes_between_them() -> None:
    """Set-ups that cannot share a process (glibc's allocator settings): each pair ran side by side, so a drift of
    the machine from pair to pair (here 1.0 to 1.3) moves both sides and leaves each pair's ratio at ~1.05."""
    drift = [1.0, 1.1, 1.2, 1.3, 1.15, 1.05]
    tuned = [10.0 * speed for speed in drift]
    defaults = [10.5 * speed * (1 + 0.002 * (-1) ** index) for index, speed in enumerate(drift)]
    found = ratio_over_pairs(defaults, tuned)
    assert found.value == pytest.approx(1.05, rel=3e-3) and found.measurable and found.every_process
    assert 1.04 < found.low <= found.value <= found.high < 1.06
    assert found.process_values == tuple(pytest.approx(d / t) for d, t in zip(defaults, tuned, strict=True))
    # The rows' own intervals (order statistics of 6 medians) overlap: unpaired, no difference could be shown.
    low_d, high_d = between_process_interval(defaults) or (0.0, 0.0)
    low_t, high_t = between_process_interval(tuned) or (0.0, 0.0)
    assert low_d < high_t and low_t < high_d
    one = ratio_over_pairs([2.0], [1.0])
    assert one.value == 2.0 and math.isinf(one.high) and not one.measurable
    with pytest.raises(ValueError, match="same number of processes"):
        ratio_over_pairs([1.0, 2.0], [1.0])


def test_no_measurable_difference_when_the_processes_disagree_on_the_direction() -> None:
    rng = random.Random(7)
    equal_a, equal_b = _paired_processes(rng, processes=6, rounds=30, ratio=1.0, drift=0.01, jitter=0.05)
    tie = paired_ratio(equal_a, equal_b)
    assert tie.low <= 1.0 <= tie.high and not tie.measurable and not tie.every_process


def test_processes_at_two_speeds_are_told_apart_from_a_spread() -> None:
    """Measured on a Zen 5 VM (README, "Timing you can trust"): one process at 1.197 ms, five at 1.676-1.711."""
    jumped = (1.197, 1.684, 1.711, 1.705, 1.689, 1.676)
    assert two_speeds(jumped) == ((1.197,), (1.676, 1.684, 1.689, 1.705, 1.711))
    # An ordinary run of the same combination, and one whose processes spread wide but evenly: no split.
    assert two_speeds((1.191, 1.194, 1.255, 1.190, 1.216, 1.208)) is None
    assert two_speeds((12.174, 12.343, 13.562, 13.580, 13.628, 13.745)) is None  # 9.9 % < 10 %
    assert two_speeds((1.0, 1.12, 1.26, 1.41)) is None  # 12 % steps, each as wide as the groups: a spread
    assert two_speeds((2.0,)) is None and two_speeds(()) is None


def test_a_two_speed_combination_is_warned_about_with_its_groups_and_what_to_try() -> None:
    import dataclasses

    from pipeline.records.wording import measurement_warnings
    from tests.helpers.records import make_record

    record = dataclasses.replace(
        make_record(16, "cpu", "inference", 1.68), process_step_times_ms=(1.197, 1.684, 1.711, 1.705, 1.689, 1.676)
    )
    (warning,) = [text for text in measurement_warnings(record) if text.startswith("two speeds")]
    assert warning.startswith(
        "two speeds: 1 timing process(es) at 1.197 ms and 5 at 1.676-1.711 ms, 40 % apart with none between; with "
        f"{record.conditions.threads} threads on a small VM"
    )
    assert warning.endswith("`profile.threads: 1`, the default, times steadily")
    steady = dataclasses.replace(record, process_step_times_ms=(1.191, 1.194, 1.255, 1.190, 1.216, 1.208))
    assert not [text for text in measurement_warnings(steady) if text.startswith("two speeds")]
    one_thread = dataclasses.replace(record, conditions=dataclasses.replace(record.conditions, threads=1))
    (other,) = [text for text in measurement_warnings(one_thread) if text.startswith("two speeds")]
    assert other.endswith(
        "a process settled at another speed in this combination (a process's heap, page placement and kernels can "
        "differ from another's)"
    )


def test_processes_split_only_by_the_speed_they_shared_raise_no_two_speeds_warning() -> None:
    """Processes 31 % apart in two groups that, with each process's speed shared by all combinations divided out,
    agree within ±1.5 %: the process as a whole moved, which the row's interval holds and every paired ratio
    cancels; the report says how far apart the processes ran, once."""
    import dataclasses

    from pipeline.records.wording import measurement_warnings
    from tests.helpers.records import make_record

    record = make_record(1, "cpu", "train", 1.2)
    split = (1.0, 1.01, 1.02, 1.32, 1.33, 1.34)
    shared = dataclasses.replace(
        record,
        process_step_times_ms=split,
        conditions=dataclasses.replace(record.conditions, threads=1),
        timing=dataclasses.replace(record.timing, own_ci_pct=1.5),
    )
    assert two_speeds(split) is not None
    assert not [text for text in measurement_warnings(shared) if text.startswith("two speeds")]
    own = dataclasses.replace(shared, timing=dataclasses.replace(shared.timing, own_ci_pct=14.2))
    # Its own split, but every paired ratio it takes part in decided: it changes no conclusion, so it is not said.
    assert not [t for t in measurement_warnings(own, disagreement_matters=False) if t.startswith("two speeds")]
    (warning,) = [text for text in measurement_warnings(own) if text.startswith("two speeds")]
    assert (
        "with the speed every combination shared in each process divided out, its processes still spread ±14.2 %: "
        "a process settled at another speed in this combination" in warning
    ), warning
