"""The report's comparison of the profiled combinations: one row per combination, its table, the notes on
measurement quality and the batch-size sentences.
"""

from __future__ import annotations

import itertools
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.profiling.record import Combination, ProfileRecord
from pipeline.profiling.statistics import Interval, noisy_advice, ratio

CONVOLUTION = re.compile(r"conv", re.IGNORECASE)


@dataclass(frozen=True)
class ComparisonRow:
    """One profiled combination in the report's comparison table and `plots/profile_comparison.csv`."""

    batch_size: int
    device: str
    mode: str
    series: str  # one plotted line: "<device> <mode>"
    step_time_ms: float  # median per-step time
    step_time_ms_iqr: float
    step_time_ms_ci_low: float  # its 95 % confidence interval
    step_time_ms_ci_high: float
    step_time_ci_pct: float
    steps_measured: int
    blocks_measured: int
    per_sample_ms: float
    per_sample_ms_ci_low: float  # the step's interval ÷ batch size
    per_sample_ms_ci_high: float
    throughput_samples_per_s: float
    throughput_samples_per_s_ci_low: float  # batch size ÷ the step interval's high end (and high from low)
    throughput_samples_per_s_ci_high: float
    noisy: bool  # the interval missed profile.ci_target_pct
    ci_target_pct: float
    drift_pct: float  # the machine's speed drift included in the interval (95 % half-width, %); 0: not included
    machine_busy: bool  # load average above the cores while timing
    load_average_before: float
    load_average_after: float
    cores: int
    threads: int
    top_operator: str
    top_operator_share_pct: float
    convolution_share_pct: float

    @property
    def combination(self) -> Combination:
        return Combination(self.batch_size, self.device, self.mode)  # type: ignore[arg-type]

    @property
    def step_interval(self) -> Interval:
        return Interval(self.step_time_ms, self.step_time_ms_ci_low, self.step_time_ms_ci_high)

    @property
    def per_sample_interval(self) -> Interval:
        return self.step_interval.scaled(1.0 / self.batch_size)

    @property
    def flags(self) -> str:
        return ", ".join(flag for flag, raised in (("noisy", self.noisy), ("busy", self.machine_busy)) if raised)


# Columns of plots/profile_comparison.csv (what `dvc plots show` draws). Each plotted value `<y>` has its 95 %
# interval in `<y>_ci_low` and `<y>_ci_high`: the error-bar templates in .dvc/plots read those columns.
COMPARISON_PLOT_FIELDS = (
    "batch_size",
    "series",
    "per_sample_ms",
    "per_sample_ms_ci_low",
    "per_sample_ms_ci_high",
    "throughput_samples_per_s",
    "throughput_samples_per_s_ci_low",
    "throughput_samples_per_s_ci_high",
    "step_time_ms",
    "step_time_ms_ci_low",
    "step_time_ms_ci_high",
)


def rate_interval(amount: float, time: Interval) -> Interval:
    """`amount` per unit of `time` (samples/s from ms per step, GFLOP/s from ms per step), with its interval.

    A rate is the inverse of a time, so its low end comes from the time's high end and its high end from the
    time's low end. A time interval reaching 0 (too few timed blocks) bounds the rate from below only: its
    high end is then infinite.
    """
    high = amount / time.low if time.low > 0 else math.inf
    return Interval(amount / time.value, amount / time.high, high)


def comparison_rows(profiles: Sequence[ProfileRecord]) -> list[ComparisonRow]:
    rows = []
    for record in profiles:
        combination, timing, conditions = record.combination, record.timing, record.conditions
        top = record.top_operators
        per_sample = timing.per_sample_interval(combination.batch_size)
        throughput = rate_interval(1000.0 * combination.batch_size, timing.step_interval())
        rows.append(
            ComparisonRow(
                batch_size=combination.batch_size,
                device=combination.device,
                mode=combination.mode,
                series=f"{combination.device} {combination.mode}",
                step_time_ms=timing.step_time_ms_median,
                step_time_ms_iqr=timing.step_time_ms_iqr,
                step_time_ms_ci_low=timing.step_time_ms_ci_low,
                step_time_ms_ci_high=timing.step_time_ms_ci_high,
                step_time_ci_pct=timing.step_time_ci_pct,
                steps_measured=timing.steps_measured,
                blocks_measured=timing.blocks_measured,
                per_sample_ms=timing.per_sample_ms,
                per_sample_ms_ci_low=per_sample.low,
                per_sample_ms_ci_high=per_sample.high,
                throughput_samples_per_s=timing.throughput_samples_per_s,
                throughput_samples_per_s_ci_low=throughput.low,
                throughput_samples_per_s_ci_high=throughput.high,
                noisy=timing.noisy,
                ci_target_pct=record.settings.ci_target_pct,
                drift_pct=timing.drift_pct,
                machine_busy=conditions.busy,
                load_average_before=conditions.load_average_before,
                load_average_after=conditions.load_average_after,
                cores=conditions.cores,
                threads=conditions.threads,
                top_operator=top[0].operator if top else "",
                top_operator_share_pct=top[0].share_pct if top else 0.0,
                convolution_share_pct=sum(row.share_pct for row in top if CONVOLUTION.search(row.operator)),
            )
        )
    return rows


def comparison_markdown(rows: Sequence[ComparisonRow]) -> str:
    lines = [
        "| batch | device | mode | step ms (median) | IQR ms | 95 % CI | steps / blocks | per-sample ms | samples/s "
        "| top operator (share) | convolution share | flag |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    for row in rows:
        lines.append(
            f"| {row.batch_size} | {row.device} | {row.mode} | {row.step_time_ms:.3f} | {row.step_time_ms_iqr:.3f} | "
            f"±{row.step_time_ci_pct:.1f} % | {row.steps_measured} / {row.blocks_measured} | {row.per_sample_ms:.4f} | "
            f"{row.throughput_samples_per_s:.0f} | `{row.top_operator}` ({row.top_operator_share_pct:.1f} %) | "
            f"{row.convolution_share_pct:.1f} % | {row.flags} |"
        )
    return "\n".join(lines) + "\n" + "".join(f"\n{note}\n" for note in measurement_notes(rows))


def measurement_notes(rows: Sequence[ComparisonRow]) -> list[str]:
    """What the comparison table's numbers are, and what its flags mean where any row raised one."""
    drift = max((row.drift_pct for row in rows), default=0.0)
    widened = (
        f", widened by the machine's speed drift (±{drift:.1f} %, measured by the `roofs` stage: how far a rerun "
        "minutes later can move)"
        if drift > 0
        else ""
    )
    notes = [
        "Step time: each of `profile.processes` fresh processes times blocks of consecutive steps and takes the "
        "median of their per-step means; the step time is the median over the processes, with the half-width of "
        f"its 95 % confidence interval from the spread between processes{widened} (a rerun lands inside it, not "
        "only the next block); IQR is the spread of all blocks."
    ]
    noisy = [row for row in rows if row.noisy]
    if noisy:
        advice = noisy_advice(max(row.drift_pct for row in noisy), min(row.ci_target_pct for row in noisy))
        names = ", ".join(f"{row.batch_size}-{row.device}-{row.mode}" for row in noisy)
        notes.append(
            f"**{advice}** ({names}): the confidence interval missed `profile.ci_target_pct` "
            "before `profile.time_budget_s` ran out."
        )
    busy = [row for row in rows if row.machine_busy]
    if busy:
        loads = ", ".join(
            f"{row.batch_size}-{row.device}-{row.mode} ({row.load_average_before:.2f} -> {row.load_average_after:.2f})"
            for row in busy
        )
        notes.append(
            f"**Warning: busy machine**: the load average exceeded the {busy[0].cores} cores while timing {loads}; "
            "those step times are likely inflated and less stable: rerun on a quiet machine."
        )
    return notes


def comparison_sentences(rows: Sequence[ComparisonRow]) -> list[str]:
    """Plain sentences drawn from the comparison numbers; every ratio with its 95 % interval."""
    sentences: list[str] = []
    by_series: dict[tuple[str, str], list[ComparisonRow]] = {}
    for row in rows:
        by_series.setdefault((row.device, row.mode), []).append(row)
    for (device, mode), series in sorted(by_series.items()):
        series.sort(key=lambda row: row.batch_size)
        largest = series[-1]
        sentences.append(
            f"**{device} {mode}**: at batch {largest.batch_size} the top operator is `{largest.top_operator}` "
            f"({largest.top_operator_share_pct:.1f} % of the step) and convolution operators together take "
            f"{largest.convolution_share_pct:.1f} % of it."
        )
        if len(series) > 1:
            sentences.append(batch_scaling_sentence(series, mode))
    return sentences


def batch_scaling_sentence(series: Sequence[ComparisonRow], mode: str) -> str:
    """How per-sample time moves with the batch size in one device/mode series (two or more batch sizes).

    Monotone (no larger batch measurably dearer per sample than a smaller one, or none measurably cheaper):
    the smallest against the largest batch. Otherwise the path, each step read from the two intervals, and
    the cheapest batch against the next cheapest. Every pair of batch sizes counts, not only neighbours:
    steps too small to measure one by one can add up to a measurable rise, and then "falls from the smallest
    to the largest" would hide a cheaper batch between them.
    """
    ordered = sorted(series, key=lambda row: row.batch_size)
    pairs = [
        ratio(earlier.per_sample_interval, later.per_sample_interval)
        for index, earlier in enumerate(ordered)
        for later in ordered[index + 1 :]
    ]
    falls = any(cheaper.measurable and cheaper.value > 1 for cheaper in pairs)
    rises = any(cheaper.measurable and cheaper.value < 1 for cheaper in pairs)
    if falls and rises:
        return _not_monotone_sentence(ordered)
    return _smallest_vs_largest_sentence(ordered[0], ordered[-1], mode) + _plateau(ordered)


def _plateau(ordered: Sequence[ComparisonRow]) -> str:
    """Where a falling series levels off: the first batch between the smallest and the largest that the data
    cannot tell from the largest (a fall from 1 to 64 that was over by 16 reads as such, not as a steady fall)."""
    largest = ordered[-1]
    for row in ordered[1:-1]:
        same = ratio(row.per_sample_interval, largest.per_sample_interval)
        if not same.measurable and row.per_sample_ms != largest.per_sample_ms:
            return (
                f" It levels off from batch {row.batch_size} on: {row.per_sample_ms:.4f} ms there against "
                f"{largest.per_sample_ms:.4f} ms at batch {largest.batch_size}, {same.describe()}."
            )
    return ""


def _not_monotone_sentence(ordered: Sequence[ComparisonRow]) -> str:
    """The per-sample time at each batch size, each step read from the intervals, and the cheapest batch:
    crowned only where it is measurably cheaper than the next cheapest."""
    path = [f"{ordered[0].per_sample_ms:.4f} ms at batch {ordered[0].batch_size}"]
    for earlier, later in itertools.pairwise(ordered):
        step = ratio(earlier.per_sample_interval, later.per_sample_interval)
        where = f"{later.per_sample_ms:.4f} ms at batch {later.batch_size}"
        if not step.measurable:
            path.append(f"{where} (no measurable change)")
        else:
            path.append(f"{'falling' if step.value > 1 else 'rising'} to {where}")
    by_cost = sorted(ordered, key=lambda row: row.per_sample_ms)
    cheapest = by_cost[0]
    # Those the data cannot tell from the cheapest (a wide interval can tie a dearer batch and not a nearer one).
    tied = [row for row in by_cost if not ratio(row.per_sample_interval, cheapest.per_sample_interval).measurable]
    opening = f"Per-sample time is not monotone in batch size: {', '.join(path)}"
    if len(tied) > 1:
        names = [
            f"batch {row.batch_size} ({_per_sample_with_interval(row)})"
            for row in sorted(tied, key=lambda row: row.batch_size)
        ]
        listed = f"{', '.join(names[:-1])} and {names[-1]}"
        between = (
            f"{ratio(tied[1].per_sample_interval, cheapest.per_sample_interval).describe()} between them"
            if len(tied) == 2
            else "none measurably dearer than the lowest"
        )
        return f"{opening}; the cheapest are {listed}: {between}, so the data name no single cheapest batch."
    runner_up = by_cost[1]
    cheaper = ratio(runner_up.per_sample_interval, cheapest.per_sample_interval)
    return (
        f"{opening}; the cheapest is batch {cheapest.batch_size} ({_per_sample_with_interval(cheapest)}), "
        f"{cheaper.value:.1f}x (95 % CI {cheaper.bounds()}) cheaper than the next cheapest, "
        f"batch {runner_up.batch_size}."
    )


def _per_sample_with_interval(row: ComparisonRow) -> str:
    interval = row.per_sample_interval
    return f"{interval.value:.4f} ms per sample, 95 % CI {interval.low:.4f}-{interval.high:.4f} ms"


def _smallest_vs_largest_sentence(smallest: ComparisonRow, largest: ComparisonRow, mode: str) -> str:
    """Per-sample time from the smallest to the largest batch, with the ratio's 95 % interval."""
    cheaper = ratio(smallest.per_sample_interval, largest.per_sample_interval)
    small, large = f"batch {smallest.batch_size}", f"batch {largest.batch_size}"
    if not cheaper.measurable:
        return (
            f"Per-sample time at {small} ({smallest.per_sample_ms:.4f} ms) and at {large} "
            f"({largest.per_sample_ms:.4f} ms): {cheaper.describe()}."
        )
    if cheaper.value < 1:
        return (
            f"Per-sample time rises from {smallest.per_sample_ms:.4f} ms at {small} to {largest.per_sample_ms:.4f} ms "
            f"at {large} ({1 / cheaper.value:.1f}x dearer, 95 % CI {1 / cheaper.high:.2f}-{1 / cheaper.low:.2f}x)."
        )
    return (
        f"Per-sample time falls from {smallest.per_sample_ms:.4f} ms at {small} to {largest.per_sample_ms:.4f} ms at "
        f"{large} ({cheaper.value:.1f}x cheaper, 95 % CI {cheaper.bounds()}): fixed per-step costs (operator "
        f"dispatch, {'the optimizer update, ' if mode == 'train' else ''}kernel set-up) are shared by more samples, "
        f"and at {small} the top operator is `{smallest.top_operator}`."
    )
