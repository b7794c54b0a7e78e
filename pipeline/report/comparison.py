"""The report's comparison of the profiled combinations: one row per combination, its table, the notes on
measurement quality and the batch-size sentences.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from pipeline.profiling.record import Combination, ProfileRecord
from pipeline.profiling.statistics import NOISY_ADVICE, Interval, ratio

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
    throughput_samples_per_s: float
    noisy: bool  # the interval missed profile.ci_target_pct
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


# Columns of plots/profile_comparison.csv (what `dvc plots show` draws).
COMPARISON_PLOT_FIELDS = (
    "batch_size",
    "series",
    "per_sample_ms",
    "throughput_samples_per_s",
    "step_time_ms",
    "step_time_ms_ci_low",
    "step_time_ms_ci_high",
)


def comparison_rows(profiles: Sequence[ProfileRecord]) -> list[ComparisonRow]:
    rows = []
    for record in profiles:
        combination, timing, conditions = record.combination, record.timing, record.conditions
        top = record.top_operators
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
                throughput_samples_per_s=timing.throughput_samples_per_s,
                noisy=timing.noisy,
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
    notes = [
        "Step time: each of `profile.processes` fresh processes times blocks of consecutive steps and takes the "
        "median of their per-step means; the step time is the median over the processes, with the half-width of "
        "its 95 % confidence interval from the spread between processes (a rerun lands inside it, not only the "
        "next block); IQR is the spread of all blocks."
    ]
    noisy = [f"{row.batch_size}-{row.device}-{row.mode}" for row in rows if row.noisy]
    if noisy:
        notes.append(
            f"**{NOISY_ADVICE}** ({', '.join(noisy)}): the confidence interval missed `profile.ci_target_pct` "
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
        largest, smallest = series[-1], series[0]
        sentences.append(
            f"**{device} {mode}**: at batch {largest.batch_size} the top operator is `{largest.top_operator}` "
            f"({largest.top_operator_share_pct:.1f} % of the step) and convolution operators together take "
            f"{largest.convolution_share_pct:.1f} % of it."
        )
        if len(series) > 1:
            sentences.append(batch_scaling_sentence(smallest, largest, mode))
    return sentences


def batch_scaling_sentence(smallest: ComparisonRow, largest: ComparisonRow, mode: str) -> str:
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
