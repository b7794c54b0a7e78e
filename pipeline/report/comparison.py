"""The report's comparison of the profiled combinations: one row per combination, its table, the notes on
measurement quality, and the table of paired ratios (pipeline.records.profile.DeviceComparisons).
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from pipeline.devices.registry import device_kind, host_kind
from pipeline.records.profile import Combination, DeviceComparisons, ProfileRecord
from pipeline.records.quantities import Interval
from pipeline.records.statistics import (
    MIN_ORDER_STATISTIC_PROCESSES,
    PROCESSES_DISAGREE_ADVICE,
    SWITCH_WARMUP_S,
    processes_disagree,
)
from pipeline.records.wording import ratio_table

CONVOLUTION = re.compile(r"conv", re.IGNORECASE)


# Beside a number measured on a traced pass that did not run like the timing processes (TraceCheck.inside false).
NOT_THE_TIMED_STEP = (
    "from a traced pass that did not run like the timing processes (the note **Table not the timed step** under the "
    "step-time table): it describes another step, and no sentence of the analysis quotes it."
)


class _OnADevice(Protocol):
    @property
    def batch_size(self) -> int: ...
    @property
    def device(self) -> str: ...
    @property
    def mode(self) -> str: ...


Placed = TypeVar("Placed", bound=_OnADevice)


def host_and_gpu_pairs(items: Sequence[Placed]) -> list[tuple[Placed, Placed]]:
    """(host, gpu) items of the same batch size and mode, in the order of the gpu items: the host kind's (the CPU)
    against each kind that computes off the host."""
    host = {(item.batch_size, item.mode): item for item in items if item.device == host_kind().name}
    return [
        (host[(item.batch_size, item.mode)], item)
        for item in items
        if not device_kind(item.device).on_host and (item.batch_size, item.mode) in host
    ]


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
    noisy: bool  # the interval is wider than profile.ci_target_pct (`disagree` and `too_few_processes` say why)
    ci_target_pct: float
    own_ci_pct: float  # the row's own spread between processes, the speed they all shared divided out (±%)
    processes: int  # timing processes behind the interval
    trace_inside: bool  # the operator table's pass lies inside the timed interval (True where not checked)
    machine_busy: bool  # load average above the cores while timing
    load_average_before: float
    load_average_after: float
    cores: int
    threads: int
    top_operator: str
    top_operator_share_pct: float
    convolution_share_pct: float
    # The table's second operator, and whether the first still leads it with the profiler's hooks taken off their calls.
    second_operator: str = ""
    second_operator_share_pct: float = 0.0
    top_operator_ranked: bool = True
    peak_memory_mb: float | None = None  # what the step holds at its peak (None: not measured in the record)
    energy_mj_per_sample: Interval | None = None  # where the device has an energy counter

    @property
    def combination(self) -> Combination:
        return Combination(self.batch_size, self.device, self.mode)  # type: ignore[arg-type]

    @property
    def step_interval(self) -> Interval:
        return Interval(self.step_time_ms, self.step_time_ms_ci_low, self.step_time_ms_ci_high)

    @property
    def per_sample_interval(self) -> Interval:
        return self.step_interval * (1.0 / self.batch_size)

    @property
    def disagree(self) -> bool:
        """The interval is too wide because the processes spread (`processes_disagree`)."""
        return processes_disagree(self.noisy, self.processes)

    @property
    def too_few_processes(self) -> bool:
        """The interval is too wide from too few processes to pin the median down, whatever they show."""
        return self.noisy and not self.disagree

    def flags(self, every_row_disagrees: bool = False) -> str:
        """The row's flags; "processes disagree" left out where every row raised it (said once, under the table)."""
        raised = (
            ("processes disagree", self.disagree and not every_row_disagrees),
            ("too few processes", self.too_few_processes),
            ("busy", self.machine_busy),
            ("table not the timed step", not self.trace_inside),
        )
        return ", ".join(flag for flag, up in raised if up)


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
        per_sample = record.per_sample
        throughput = rate_interval(1000.0 * combination.batch_size, timing.step_interval)
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
                own_ci_pct=timing.own_spread_pct,
                processes=len(record.process_step_times_ms) or record.settings.processes,  # older records: settings
                trace_inside=record.traced_like_timed,
                machine_busy=conditions.busy,
                load_average_before=conditions.load_average_before,
                load_average_after=conditions.load_average_after,
                cores=conditions.cores,
                threads=conditions.threads,
                top_operator=top[0].operator if top else "",
                top_operator_share_pct=top[0].share_pct if top else 0.0,
                convolution_share_pct=sum(row.share_pct for row in top if CONVOLUTION.search(row.operator)),
                second_operator=top[1].operator if len(top) > 1 else "",
                second_operator_share_pct=top[1].share_pct if len(top) > 1 else 0.0,
                top_operator_ranked=record.top_operator_ranked,
                peak_memory_mb=record.memory.peak_mb if record.memory else None,
                energy_mj_per_sample=(record.energy_per_sample * 1000 if record.energy_per_sample else None),
            )
        )
    return rows


def undecided_rows(rows: Sequence[ComparisonRow], comparisons: Sequence[DeviceComparisons]) -> set[str]:
    """The rows (combination names) whose spread could change a conclusion: those in a paired ratio whose interval
    holds 1, so that its direction is undecided."""
    return {name for found in comparisons for name in found.undecided_names()}


def comparison_markdown(rows: Sequence[ComparisonRow], comparisons: Sequence[DeviceComparisons] | None = None) -> str:
    """The comparison table and its notes. With the paired comparisons, a row is flagged "processes disagree" only where
    that could change a conclusion (it takes part in a ratio whose direction is undecided); without them, wherever its
    processes spread beyond `profile.ci_target_pct`."""
    if comparisons is not None:
        undecided = undecided_rows(rows, comparisons)
        rows = [
            row if row.combination.name in undecided else dataclasses.replace(row, noisy=row.too_few_processes)
            for row in rows
        ]
    lines = [
        "| batch | device | mode | step ms (median) | IQR ms | 95 % CI ms | steps / blocks | per-sample ms | samples/s "
        "| top operator (share) | convolution share | flag |",
        "| ---: | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: | --- |",
    ]
    every_row_disagrees = _every_row_disagrees(rows)
    for row in rows:
        lines.append(
            f"| {row.batch_size} | {row.device} | {row.mode} | {row.step_time_ms:.3f} | {row.step_time_ms_iqr:.3f} | "
            f"{row.step_time_ms_ci_low:.3f}–{row.step_time_ms_ci_high:.3f} | "
            f"{row.steps_measured} / {row.blocks_measured} | {row.per_sample_ms:.4f} | "
            f"{row.throughput_samples_per_s:.0f} | {_top_operator_cell(row)} | "
            f"{row.convolution_share_pct:.1f} % | {row.flags(every_row_disagrees)} |"
        )
    return "\n".join(lines) + "\n" + "".join(f"\n{note}\n" for note in measurement_notes(rows))


def _top_operator_cell(row: ComparisonRow) -> str:
    """The table's first operator, or its first two where the profiler's hooks could swap them (not ranked)."""
    cell = f"`{row.top_operator}` ({row.top_operator_share_pct:.1f} %)"
    if row.top_operator_ranked:
        return cell
    return f"{cell} or `{row.second_operator}` ({row.second_operator_share_pct:.1f} %), not ranked"


def _every_row_disagrees(rows: Sequence[ComparisonRow]) -> bool:
    return len(rows) > 1 and all(row.disagree for row in rows)


def measurement_notes(rows: Sequence[ComparisonRow]) -> list[str]:
    """What the comparison table's numbers are, and what each raised flag means, for the rows that raised it."""
    notes = [
        "Step time: each of `profile.processes` fresh processes times every combination of the device interleaved, "
        "one block of consecutive steps per combination per round, in random order, each after about "
        f"{1000 * SWITCH_WARMUP_S:g} ms of the same step untimed, rounded to whole steps (none for a step over "
        f"{2000 * SWITCH_WARMUP_S:g} ms); a row's step time is the "
        "median over the processes of their medians, its 95 % CI the spread between processes within this run. "
        "IQR is the spread of "
        "all blocks. Convolution share: the rows of the operator table whose name holds `conv` (wrappers such as "
        "`aten::_convolution` included), as % of the traced step's operator time."
    ]

    def names(flagged: Sequence[ComparisonRow]) -> str:
        return ", ".join(f"{row.batch_size}-{row.device}-{row.mode}" for row in flagged)

    disagree = [row for row in rows if row.disagree]
    if disagree:
        spreads = ", ".join(f"{row.batch_size}-{row.device}-{row.mode} ±{row.own_ci_pct:.1f} %" for row in disagree)
        every = _every_row_disagrees(rows)
        whose = "each row's" if every else "these rows'"
        notes.append(
            f"**Processes disagree**{', in every row' if every else ''} ({spreads}): beyond the speed all "
            f"combinations shared in each timing process, {whose} processes still spread "
            f"this wide, more than `profile.ci_target_pct` (±{disagree[0].ci_target_pct:g} %)"
            + ("; this machine held no combination to it, so it is said here once, not on each row" if every else "")
            + f"; {PROCESSES_DISAGREE_ADVICE}."
        )
    too_few = [row for row in rows if row.too_few_processes]
    if too_few:
        intervals = ", ".join(
            f"{row.batch_size}-{row.device}-{row.mode} ±{row.step_time_ci_pct:.1f} % from {row.processes}"
            for row in too_few
        )
        minimum = MIN_ORDER_STATISTIC_PROCESSES
        notes.append(
            f"**Too few processes** ({intervals}): each of these intervals comes from fewer than {minimum} timing "
            "processes, too few for a distribution-free interval of the median, and is wider than "
            f"`profile.ci_target_pct` (±{too_few[0].ci_target_pct:g} %): it says how little so few processes pin the "
            f"median down, not that they disagree; `profile.processes: {minimum}` or more gives a distribution-free "
            "interval."
        )
    busy = [row for row in rows if row.machine_busy]
    if busy:
        loads = ", ".join(
            f"{row.batch_size}-{row.device}-{row.mode} ({row.load_average_before:.2f} -> {row.load_average_after:.2f})"
            for row in busy
        )
        notes.append(
            f"**Busy machine**: the load average exceeded the {busy[0].cores} cores while timing {loads}; "
            "those step times may be slower and less stable than on a quiet machine: rerun on one to know."
        )
    mismatched = [row for row in rows if not row.trace_inside]
    if mismatched:
        notes.append(
            f"**Table not the timed step** ({names(mismatched)}): in none of the traced passes did the tracing "
            "process run like the timing processes (each table says by how much, and against what); their operator "
            "shares describe another step, and the analysis does not quote them."
        )
    return notes


def comparisons_table(comparisons: Sequence[DeviceComparisons]) -> str:
    """Every paired ratio of every device, the training step's parts after its ratios (`DeviceComparisons.parts`: the
    full step over the step without its update, that over inference), as the report's table."""
    return "\n".join(ratio_table([c for found in comparisons for c in (*found.comparisons, *found.parts)])) + "\n"
