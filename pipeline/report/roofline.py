"""The roofline: each FLOP-carrying operator and each whole step placed by its arithmetic intensity under the
device's two measured roofs (Williams, Waterman & Patterson, CACM 2009).

Arithmetic intensity is FLOPs over the bytes the work reads and writes (inputs, weights, outputs), both counted
by the profile stage on the real step (pipeline.profiling.run.count_step_flops): per operator for its counted
calls, per step over every operator (views move nothing): each operator's bytes moved once, a step's summed as if
no cache held anything between its operators. The attainable rate at intensity I is min(matmul roof, bandwidth
roof x I): left of the ridge (where the two meet) an operation is memory-bound, right of it compute-bound. Both
roofs come from the `roofs` stage (hardware/roofs.json). Torch-free; reads profile records only.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import matplotlib
import matplotlib.pyplot as plt
from matplotlib.ticker import FuncFormatter, NullFormatter

from pipeline.records.profile import ProfileRecord
from pipeline.records.quantities import Interval
from pipeline.report.comparison import NOT_THE_TIMED_STEP, rate_interval
from pipeline.report.figures import save_figure
from pipeline.report.tables import markdown_table

matplotlib.use("Agg")  # no display: CI and servers

UNDECIDED = "left of the ridge: not decided"
NEAR_RIDGE = "near the ridge: not decided"
# A point is called compute-bound only at twice the ridge's intensity or more: its count is each operator's bytes
# moved once, so re-reads from DRAM could move a point just right of the ridge to its left.
COMPUTE_BOUND_MARGIN = 2.0
WHOLE_STEP = "whole step"
BATCH_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown", "tab:pink")


@dataclass(frozen=True)
class RooflinePoint:
    """One operator (or the whole step) of one combination on the roofline."""

    device: str
    mode: str
    batch_size: int
    name: str  # the ATen operator, or WHOLE_STEP
    intensity: float  # FLOPs per byte read and written
    achieved: Interval  # GFLOP/s: the step's from its timed interval; an operator's from its traced self time
    peak_gflops_per_s: float  # the device's matmul roof
    bandwidth_gb_per_s: float  # the device's triad roof
    megabytes: float = 0.0  # read and written: per call for an operator, per step for the whole step
    traced_like_timed: bool = True  # an operator's traced pass ran like the timing processes (its rate counts)

    @property
    def ridge(self) -> float:
        return self.peak_gflops_per_s / self.bandwidth_gb_per_s

    @property
    def roof_gflops_per_s(self) -> float:
        """What the device can attain at this intensity."""
        return min(self.peak_gflops_per_s, self.bandwidth_gb_per_s * self.intensity)

    @property
    def roof_pct(self) -> float:
        return 100.0 * self.achieved.value / self.roof_gflops_per_s

    @property
    def bound(self) -> str:
        """At or right of the ridge at its counted intensity (each operator's bytes moved once; a step's summed as if
        no cache held anything between its operators) a point is compute-bound unless re-reads from DRAM multiply its
        traffic; left of it the count decides nothing (a step's operators may share data through a cache, an
        operator's data may come from a cache)."""
        if self.intensity < self.ridge:
            return UNDECIDED
        return "compute-bound" if self.intensity >= COMPUTE_BOUND_MARGIN * self.ridge else NEAR_RIDGE

    @property
    def where(self) -> str:
        return f"{self.mode} batch {self.batch_size}"


def roofline_points(records: Sequence[ProfileRecord]) -> list[RooflinePoint]:
    """The whole step and each top operator with counted FLOPs and bytes, of every record with both roofs."""
    return [point for record in records for point in _record_points(record)]


def _record_points(record: ProfileRecord) -> list[RooflinePoint]:
    rate, combination = record.analysis.flop_rate, record.combination
    if rate.peak_gflops_per_s <= 0 or rate.bandwidth_gb_per_s <= 0:
        return []  # a record from before the roofs stage, or without its memory roof: nothing to place

    def place(name: str, intensity: float, achieved: Interval, megabytes: float) -> RooflinePoint:
        return RooflinePoint(
            device=combination.device,
            mode=combination.mode,
            batch_size=combination.batch_size,
            name=name,
            intensity=intensity,
            achieved=achieved,
            peak_gflops_per_s=rate.peak_gflops_per_s,
            bandwidth_gb_per_s=rate.bandwidth_gb_per_s,
            megabytes=megabytes,
            traced_like_timed=record.traced_like_timed or name == WHOLE_STEP,  # the whole step's rate is the timed one
        )

    points = []
    step_intensity = rate.intensity_flops_per_byte
    if step_intensity is not None:
        achieved = rate_interval(rate.flops_per_step / 1e6, record.timing.step_interval)  # FLOP/ms / 1e6 = GFLOP/s
        points.append(place(WHOLE_STEP, step_intensity, achieved, rate.bytes_per_step / 1e6))
    for row in record.top_operators:
        intensity = row.intensity_flops_per_byte
        self_ms = row.self_cpu_ms if combination.kind.on_host else row.self_device_ms
        if intensity is None or row.mflops is None or not self_ms or self_ms <= 0:
            continue
        rate_gflops = row.mflops / self_ms  # MFLOP per ms = GFLOP/s
        per_call = (row.mbytes or 0.0) / row.calls_per_step if row.calls_per_step > 0 else 0.0
        points.append(place(row.operator, intensity, Interval(rate_gflops, rate_gflops, rate_gflops), per_call))
    return points


def roofline_markdown(points: Sequence[RooflinePoint]) -> str:
    """The roofs, the table of placed points, and which operators are memory- or compute-bound on each device."""
    if not points:
        return (
            "_No roofline: the profile records carry no memory roof or byte counts (records made before this "
            "project measured its roofs): run `dvc repro`._\n"
        )
    lines = []
    by_device: dict[str, list[RooflinePoint]] = defaultdict(list)
    for point in points:
        by_device[point.device].append(point)
    for device, placed in sorted(by_device.items()):
        first = placed[0]
        lines.append(
            f"**{device}**: matmul roof {first.peak_gflops_per_s:,.1f} GFLOP/s, memory roof "
            f"{first.bandwidth_gb_per_s:,.1f} GB/s; they meet at **{first.ridge:.1f} FLOP/byte**. "
            + _bound_sentence(placed)
            + _above_sentence(placed)
            + "\n"
        )
    rows = [
        (
            point.batch_size,
            point.device,
            point.mode,
            (f"`{point.name}`" if point.name != WHOLE_STEP else f"**{WHOLE_STEP}**")
            + ("" if point.traced_like_timed else " ‡"),
            f"{point.intensity:.2f}",
            f"{point.achieved.value:.2f}",
            f"{point.roof_gflops_per_s:.1f}",
            f"{point.roof_pct:.1f}",
            point.bound,
        )
        for point in sorted(points, key=lambda p: (p.device, p.mode, p.batch_size, p.name != WHOLE_STEP, p.name))
    ]
    columns = (">batch", "device", "mode", "work", ">FLOP/byte", ">GFLOP/s", ">roof GFLOP/s", ">% of roof", "bound")
    table = markdown_table(columns, rows)
    note = (
        "FLOP/byte: FLOPs over the bytes each operator reads and writes at least once (inputs, weights, outputs), as "
        "the profile stage counted them on the real step; a step's bytes are the sum over its operators, as if "
        "nothing stayed in a cache between them. An operator that re-reads its data from DRAM moves more (further "
        "left); a step whose operators pass data through a cache moves less (further right). GFLOP/s: the whole "
        "step's from its timed median; an operator's from its traced self time (one traced pass, no interval). "
        "Roof: min(matmul roof, memory roof x FLOP/byte), both measured by the `roofs` stage."
    )
    if not all(point.traced_like_timed for point in points):
        note += f"\n\n‡ GFLOP/s and % of roof {NOT_THE_TIMED_STEP}"
    return "\n".join(lines) + "\n" + "\n".join(table) + "\n\n" + note + "\n"


def _bound_sentence(points: Sequence[RooflinePoint]) -> str:
    """`Compute-bound (...): ...; left of the ridge, not decided: ...`, each name with where it sits."""
    sides: dict[str, dict[str, list[RooflinePoint]]] = {
        "compute-bound": defaultdict(list),
        NEAR_RIDGE: defaultdict(list),
        UNDECIDED: defaultdict(list),
    }
    for point in points:
        sides[point.bound][point.name].append(point)
    parts = []
    for bound, names in sides.items():
        if not names:
            continue
        described = []
        for name, placed in sorted(names.items(), key=lambda item: (item[0] != WHOLE_STEP, item[0])):
            placed.sort(key=lambda p: (p.mode, p.batch_size))
            low, high = min(p.intensity for p in placed), max(p.intensity for p in placed)
            span = f"{low:.1f}" if f"{low:.1f}" == f"{high:.1f}" else f"{low:.1f}-{high:.1f}"
            label = WHOLE_STEP if name == WHOLE_STEP else f"`{name}`"
            described.append(f"{label} ({', '.join(p.where for p in placed)}; {span} FLOP/byte)")
        if bound == NEAR_RIDGE:
            parts.append(
                f"Right of the ridge at their counted intensity, but by less than {COMPUTE_BOUND_MARGIN:g}x, not "
                f"decided: {'; '.join(described)}. Re-reads from DRAM could move them left of it."
            )
        elif bound == UNDECIDED:
            parts.append(
                f"Left of the ridge at their counted intensity, not decided: {'; '.join(described)}. A step's count "
                "assumes no cache reuse between its operators, so its true intensity may lie right of the ridge; an "
                "operator's data may come from a cache rather than DRAM: only measured DRAM traffic (hardware "
                "counters) could show which of them DRAM's bandwidth bounds."
            )
        else:
            margin = math.floor(10 * min(p.intensity / p.ridge for placed in names.values() for p in placed)) / 10
            parts.append(
                f"Compute-bound at their counted intensity (at least {COMPUTE_BOUND_MARGIN:g}x right of the ridge; "
                f"re-reads from DRAM would have to multiply their traffic by more than {margin:.1f}x to move the least "
                "of them left of it): "
                f"{'; '.join(described)}."
            )
    return " ".join(parts)


def _above_sentence(points: Sequence[RooflinePoint]) -> str:
    """What a point above its roof means: under the memory roof, faster streaming than one thread's triad (a read-mostly
    operator, or data a cache holds; not measured which);
    under the matmul roof, an operator's one traced pass (no interval) against the fastest measured product."""
    above = sorted(
        (
            point
            for point in points
            if point.traced_like_timed and point.achieved.low > point.roof_gflops_per_s  # above it over its interval
        ),
        key=lambda p: (p.bound, p.name != WHOLE_STEP, p.name, p.mode, p.batch_size),
    )
    if not above:
        return ""

    def label(point: RooflinePoint) -> str:
        name = WHOLE_STEP if point.name == WHOLE_STEP else f"`{point.name}`"
        amount = f"{point.megabytes:.1f} MB per {'step' if point.name == WHOLE_STEP else 'call on average'}"
        return f"{name} ({point.where}: {point.roof_pct:.0f} % of its roof, {amount})"

    memory = [label(point) for point in above if point.bound == UNDECIDED]
    compute = [label(point) for point in above if point.bound != UNDECIDED]
    parts = []
    if memory:
        parts.append(
            f" Above the memory roof: {'; '.join(memory)}. That roof is one thread's STREAM triad over arrays far "
            "beyond the caches, counted as STREAM counts it (no write-allocate traffic): a read-mostly operator can "
            "stream faster than it from DRAM, and data small enough to stay in a cache between calls can too. Which "
            "of these holds is not measured here (no memory traffic counters)."
        )
    if compute:
        parts.append(
            f" Above the matmul roof: {'; '.join(compute)}: an operator's rate comes from one traced pass (no "
            "interval), the roof from the fastest of 15 products."
        )
    return "".join(parts)


def roofline_chart(points: Sequence[RooflinePoint], target: Path) -> None:
    """One log-log panel per device and mode: both roofs, the whole steps (stars, with their 95 % interval) and
    the operators (dots, named), coloured by batch size."""
    panels_of = sorted({(point.device, point.mode) for point in points})
    figure, panels = plt.subplots(1, len(panels_of), figsize=(5.4 * len(panels_of), 4.4), squeeze=False)
    batches = sorted({point.batch_size for point in points})
    colour = {batch: BATCH_COLOURS[index % len(BATCH_COLOURS)] for index, batch in enumerate(batches)}
    for axes, (device, mode) in zip(panels[0], panels_of, strict=True):
        placed = [point for point in points if (point.device, point.mode) == (device, mode)]
        first = placed[0]
        low = min(point.intensity for point in placed) / 3
        high = max(max(point.intensity for point in placed) * 3, first.ridge * 3)
        xs = [low * (high / low) ** (i / 200) for i in range(201)]
        axes.plot(
            xs,
            [min(first.peak_gflops_per_s, first.bandwidth_gb_per_s * x) for x in xs],
            color="black",
            linewidth=1.5,
            label=f"roofs: {first.peak_gflops_per_s:,.0f} GFLOP/s, {first.bandwidth_gb_per_s:,.0f} GB/s",
        )
        axes.axvline(first.ridge, color="gray", linestyle=":", linewidth=1)
        for point in placed:
            if point.name == WHOLE_STEP:
                value = point.achieved
                axes.errorbar(
                    [point.intensity],
                    [value.value],
                    yerr=[[value.value - value.low], [value.high - value.value]],
                    fmt="*",
                    markersize=13,
                    color=colour[point.batch_size],
                    markeredgecolor="black",
                    capsize=3,
                )
            else:
                axes.plot([point.intensity], [point.achieved.value], "o", color=colour[point.batch_size], markersize=6)
                axes.annotate(
                    point.name.removeprefix("aten::"),
                    (point.intensity, point.achieved.value),
                    textcoords="offset points",
                    xytext=(4, 3),
                    fontsize=6,
                    color=colour[point.batch_size],
                )
        for batch in batches:
            axes.plot([], [], "o", color=colour[batch], label=f"batch {batch}")
        axes.plot([], [], "*", color="white", markeredgecolor="black", markersize=11, label="whole step (95 % CI)")
        axes.set(
            xscale="log",
            yscale="log",
            xlabel="arithmetic intensity (FLOP/byte)",
            ylabel="GFLOP/s",
            title=f"Roofline: {device} {mode} (dotted: ridge {first.ridge:.1f} FLOP/byte)",
        )
        for axis in (axes.xaxis, axes.yaxis):
            axis.set_major_formatter(FuncFormatter(lambda value, _position: f"{value:g}"))
            axis.set_minor_formatter(NullFormatter())
        axes.grid(alpha=0.3, which="both")
        axes.legend(fontsize=7, loc="upper left")  # above the sloped roof: nothing can sit there
    save_figure(figure, target)
