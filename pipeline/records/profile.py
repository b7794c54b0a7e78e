"""The profile → report contract: what the `profile@<device>` stage records for each combination and for the
comparisons between them.

Torch-free on purpose: the report stage (and any tool reading `profiles/*/profile.json`) imports it
without paying for torch. The profile stage writes a `ProfileRecord`; the report reads it back with
`read_record`, so a renamed or missing field fails a fast test and a clear error, never a KeyError
deep in the report. Field names of `Timing` are also the metric names in timing.json, MLflow and
TensorBoard (the same for every combination, so MLflow's Compare lines them up).
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
import typing
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pipeline.common.checked_dataclasses import Dialect, build
from pipeline.common.errors import PipelineError
from pipeline.common.paths import DeviceProfileOutputs, ProfileOutputs, profile_outputs
from pipeline.devices.kind import DeviceKind
from pipeline.devices.registry import device_kind, device_names
from pipeline.params.schema import Device, ProfileConfig, ProfileMode
from pipeline.records.quantities import (
    Interval,
    KernelStats,
    MeasurementConditions,
    RangeStats,
    Ratio,
    StepAnatomy,
    StepEnergy,
    StepEstimate,
    StepMemory,
    StepPart,
    signed_tenth,
)
from pipeline.records.statistics import median_interval

# Profiling runs the trained weights in fp32 whatever precision training used: the lab compares
# operators and batch sizes, and a mixed-precision step would be a different program.
PROFILE_PRECISION = "fp32"
TRACE_ATTEMPTS = 3  # passes the profile stage traces at most, until one runs at the timed speed
# Section of the profile runs' metrics in MLflow and TensorBoard (`profile/step_time_ms_median`, ...).
METRIC_PREFIX = "profile/"
# The format the profile stage writes. What each format added, and what an older record lacks (a field's default
# where it lacks it): docs/timing.md#the-record-format-version-by-version.
RECORD_FORMAT = 10
T = TypeVar("T")
# Older formats the report still reads (committed records of earlier runs), converted by `_upgrade`.
READABLE_FORMATS = (2, 3, 4, 5, 6, 7, 8, 9, RECORD_FORMAT)
COMPARISON_FORMATS = (7, 8, 9, RECORD_FORMAT)  # comparisons.json: unchanged since format 7


@dataclass(frozen=True)
class Combination:
    batch_size: int
    device: Device
    mode: ProfileMode

    @property
    def name(self) -> str:
        """Same order as DVC's matrix stage name `profile@<batch>-<device>-<mode>`."""
        return f"{self.batch_size}-{self.device}-{self.mode}"

    @property
    def kind(self) -> DeviceKind:
        """Its device's kind: what it is, how it is shown (pipeline.devices)."""
        return device_kind(self.device)

    @property
    def stage_name(self) -> str:
        """The DVC stage that profiles it (one per device)."""
        return f"profile@{self.device}"

    @property
    def run_name(self) -> str:
        """The name of its MLflow run."""
        return f"profile@{self.name}"

    @property
    def outputs(self) -> ProfileOutputs:
        """Its files: the record, the tables and the trace its profile stage writes."""
        return profile_outputs(self.batch_size, self.device, self.mode)


def profile_matrix(config: ProfileConfig, device: str | None = None) -> list[Combination]:
    """Every (batch size, device, mode) params.yaml asks to profile, or those of one `device`: the one definition of
    the matrix that the profile stage, its timing processes, the report, the hand-in and the benchmarks read (stale
    folders of removed values never count). Batch sizes first, then devices, then modes, each in params order."""
    devices = config.devices if device is None else (device,)
    return [Combination(b, d, m) for b in config.batch_sizes for d in devices for m in config.modes]


@dataclass(frozen=True)
class OperatorRow:
    operator: str
    calls_per_step: float
    self_cpu_ms: float  # per step
    total_cpu_ms: float  # per step, children included
    self_device_ms: float | None  # per step; None on CPU-only runs (no GPU was traced)
    total_device_ms: float | None
    share_pct: float  # of the step's operator time (self CPU time on CPU, self device time on GPU)
    # Per step: the FLOPs of the convolutions and matrix products this operator runs itself (forward and
    # backward, torch.utils.flop_counter). None where it runs none: no FLOP formula (element-wise ops), or a
    # wrapper (`aten::conv2d`, `aten::linear`) whose work is counted once, on the operator it calls.
    mflops: float | None
    # Per step, megabytes the counted calls of this operator read and write (inputs, weights, outputs): FLOPs over
    # these bytes is its arithmetic intensity. None where mflops is None, and in older records.
    mbytes: float | None = None
    # Per step, MB (10^6 bytes) the allocator handed out on the device while this operator was the innermost one
    # running (the profiler's memory events). None in older records.
    allocated_mb: float | None = None

    @property
    def intensity_flops_per_byte(self) -> float | None:
        """FLOPs per byte moved (the roofline's x), or None without both numbers."""
        if self.mflops is None or not self.mbytes:
            return None
        return self.mflops / self.mbytes


class StepInterval:
    """The step time's median and 95 % interval as one Interval, for the record types that keep them under these
    names."""

    step_time_ms_median: float
    step_time_ms_ci_low: float
    step_time_ms_ci_high: float

    @property
    def step_interval(self) -> Interval:
        return Interval(self.step_time_ms_median, self.step_time_ms_ci_low, self.step_time_ms_ci_high)


@dataclass(frozen=True)
class Timing(StepInterval):
    """Step-time estimate of the timed pass (no profiler attached; profiling.timing); field names are metric names.

    The step time is the median of per-step block means with its 95 % confidence interval
    (pipeline.records.statistics). `noisy` when the combination's own spread between processes (`own_ci_pct`: the
    interval once the speed every combination shared in each process is divided out) missed
    `profile.ci_target_pct`: a machine that ran a whole process slower moves every row alike, which is said once
    for the device, not on each row.
    """

    step_time_ms_median: float
    step_time_ms_iqr: float  # spread of the blocks' per-step times (not the uncertainty of the median)
    step_time_ms_ci_low: float  # 95 % confidence interval of the median
    step_time_ms_ci_high: float
    step_time_ci_pct: float  # the interval lies within median ± this %
    steps_measured: int
    blocks_measured: int
    steps_per_block: int
    per_sample_ms: float  # median ÷ batch size
    throughput_samples_per_s: float  # batch size ÷ median
    noisy: bool
    timing_s: float  # wall time the timing took (it stops at the CI target or the time budget)
    peak_memory_mb: float  # what the step holds at its peak, MB (10^6 bytes): the record's `memory.peak_bytes`
    top_operator_share_pct: float
    # Fresh processes the step was timed in (profile.processes); from 2 on, the interval is their spread.
    processes: int = 1
    # The interval's half-width (%) with each process's shared speed divided out; older records: the interval's own.
    own_ci_pct: float | None = None

    @property
    def own_spread_pct(self) -> float:
        """The combination's own spread between processes (`own_ci_pct`); older records: the interval's own."""
        return self.step_time_ci_pct if self.own_ci_pct is None else self.own_ci_pct

    @classmethod
    def from_estimate(
        cls,
        estimate: StepEstimate,
        *,
        steps_per_block: int,
        timing_s: float,
        peak_memory_mb: float,
        top_operator_share_pct: float,
        own_ci_pct: float | None = None,
    ) -> Timing:
        own = estimate.ci_half_width_pct if own_ci_pct is None else own_ci_pct
        return cls(
            step_time_ms_median=estimate.median_ms,
            step_time_ms_iqr=estimate.iqr_ms,
            step_time_ms_ci_low=estimate.ci_low_ms,
            step_time_ms_ci_high=estimate.ci_high_ms,
            step_time_ci_pct=estimate.ci_half_width_pct,
            steps_measured=estimate.steps,
            blocks_measured=estimate.blocks,
            steps_per_block=steps_per_block,
            per_sample_ms=estimate.per_sample.value,
            throughput_samples_per_s=estimate.throughput_samples_per_s,
            noisy=not own <= estimate.ci_target_pct,
            timing_s=timing_s,
            peak_memory_mb=peak_memory_mb,
            top_operator_share_pct=top_operator_share_pct,
            processes=estimate.processes,
            own_ci_pct=own,
        )

    def as_metrics(self) -> dict[str, float]:
        """Numbers only, under the same names for every combination (MLflow Compare, `dvc metrics diff`)."""
        return {name: float(value) for name, value in dataclasses.asdict(self).items() if value is not None}


@dataclass(frozen=True)
class ProfileSettings:
    threads: int
    precision: str
    memory_format: str
    warmup_steps: int
    active_steps: int  # traced by torch.profiler
    optimizer_lr: float  # Adadelta's lr in train mode: the one the checkpoint was trained with
    ci_target_pct: float
    time_budget_s: float
    # How the process allocated (pipeline.common.allocator): on a CPU it moves the step time markedly.
    allocator: str = "not recorded"
    processes: int = 1  # fresh processes the step was timed in
    program_starts: int = 1  # program starts those processes were forked from
    processes_at_once: int = 1  # of those processes, how many ran side by side


@dataclass(frozen=True)
class FlopRate:
    """Arithmetic the step does ÷ the time it takes, against what the device can do."""

    flops_per_step: float  # model FLOPs per sample (forward; forward + backward in training) x batch
    step_ms: float  # the median timed step
    achieved_gflops_per_s: float
    peak_gflops_per_s: float  # measured on the same device by pipeline.profiling.peak; 0 if unknown
    peak_pct: float  # achieved / peak; 0 if the peak is unknown
    # Bytes every operator of one step reads and writes (inputs, weights, outputs; views move none): the step's
    # memory traffic if no cache reused anything. 0: not counted (older records).
    bytes_per_step: float = 0.0
    bandwidth_gb_per_s: float = 0.0  # the device's memory roof (STREAM triad, the roofs stage); 0 if unknown
    # Bytes the optimizer's update alone reads and writes per step, counted as `bytes_per_step` is. 0: inference, or
    # not counted (older records).
    update_bytes_per_step: float = 0.0

    @property
    def intensity_flops_per_byte(self) -> float | None:
        """The step's FLOPs per byte moved (the roofline's x), or None when its bytes were not counted."""
        return self.flops_per_step / self.bytes_per_step if self.bytes_per_step > 0 else None

    @property
    def ridge_flops_per_byte(self) -> float | None:
        """Where the device's two roofs meet: below it the attainable rate is bandwidth x intensity."""
        if self.peak_gflops_per_s <= 0 or self.bandwidth_gb_per_s <= 0:
            return None
        return self.peak_gflops_per_s / self.bandwidth_gb_per_s


def flop_rate(
    flops_per_sample: float,
    batch_size: int,
    step_ms: float,
    peak_gflops_per_s: float,
    bytes_per_step: float = 0.0,
    bandwidth_gb_per_s: float = 0.0,
    update_bytes_per_step: float = 0.0,
) -> FlopRate:
    flops = flops_per_sample * batch_size
    achieved = flops / (step_ms / 1000) / 1e9 if step_ms > 0 else 0.0
    return FlopRate(
        flops_per_step=flops,
        step_ms=step_ms,
        achieved_gflops_per_s=achieved,
        peak_gflops_per_s=peak_gflops_per_s,
        peak_pct=100.0 * achieved / peak_gflops_per_s if peak_gflops_per_s > 0 else 0.0,
        bytes_per_step=bytes_per_step,
        bandwidth_gb_per_s=bandwidth_gb_per_s,
        update_bytes_per_step=update_bytes_per_step,
    )


@dataclass(frozen=True)
class StepAnalysis:
    """Why the step costs what it costs, from its trace (pipeline.profiling.trace_analysis) and the measured peak."""

    anatomy: StepAnatomy
    flop_rate: FlopRate
    peak_method: str  # how the peak was measured, for the report
    ranges: tuple[RangeStats, ...]  # profiler ranges, listed apart from the operators
    top_kernels: tuple[KernelStats, ...]  # empty on the CPU
    unattributed_device_ms: float  # device time per step launched outside any operator
    parts: tuple[StepPart, ...] = ()  # the traced steps by phase and layer group (empty in older records)


@dataclass(frozen=True)
class OperatorShare:
    operator: str
    share_pct: float  # of the step's operator time


@dataclass(frozen=True)
class AllocatorWhatIf(StepInterval):
    """The same step with glibc malloc's defaults (CPU only), against the tuned allocator the record's timing ran
    with (pipeline.common.allocator).

    Timed in fresh processes that keep glibc's defaults, as many as the tuned ones, each started next to a tuned
    one (just before or just after it, in turn) from the same server and timing the same combinations interleaved:
    the slowdown is taken pair by pair, so that whatever the machine did in that minute it did to both sides.
    An older record's what-if is unpaired (`slowdown` 0)."""

    default_allocator: str  # what the what-if ran with; the record's `settings.allocator` says the tuned one
    step_time_ms_median: float  # with the defaults; the same estimator as the record's timing
    step_time_ms_ci_low: float
    step_time_ms_ci_high: float
    page_faults_per_step: float  # minor page faults (getrusage) per step with the defaults; the median process's
    tuned_page_faults_per_step: float  # the same count with the tuned allocator
    operators: tuple[OperatorShare, ...]  # the default allocator's operator shares, most expensive first
    slowdown: float = 0.0  # defaults ÷ tuned step time: the median over pairs of processes; 0: not paired
    slowdown_ci_low: float = 0.0  # its 95 % interval, from the spread of the pairs
    slowdown_ci_high: float = 0.0
    process_slowdowns: tuple[float, ...] = ()  # each pair's ratio, in the order they ran
    process_page_faults: tuple[float, ...] = ()  # each defaults process's page faults per step

    @property
    def paired(self) -> bool:
        return self.slowdown > 0


@dataclass(frozen=True)
class TraceCheck:
    """Whether the traced pass (the operator table's) ran the step the timing measured.

    Two things part a traced step from the timed one: the process that traces can run at its own speed (its heap,
    page placement and kernels are its own), and the profiler's hooks add to every operator. The stage runs steps
    untraced around each traced pass, in the same process: for the first, their median is held against where one
    more timing process would run (`expected_low_ms`-`expected_high_ms`); for the second, the traced steps against
    them. It traces up to `attempts` times and keeps the first pass inside, else the closest. An older record has no
    untraced steps: its check is the traced step itself against the timed interval."""

    traced_step_ms: float  # median ProfilerStep span of the kept pass
    timed_low_ms: float  # the timed step's 95 % interval
    timed_high_ms: float
    attempts: int  # passes traced
    # Each step run untraced around the kept pass (half before it, half after), and each of its traced steps.
    untraced_steps_ms: tuple[float, ...] = ()
    traced_steps_ms: tuple[float, ...] = ()
    # Where one more timing process's median would fall (95 % prediction from the processes' medians); the timed
    # interval where there was one process.
    expected_low_ms: float = 0.0
    expected_high_ms: float = 0.0

    @property
    def bounds_ms(self) -> tuple[float, float]:
        """What the checked step is held against: the prediction for one more process, else the timed interval."""
        if self.expected_high_ms > 0:
            return self.expected_low_ms, self.expected_high_ms
        return self.timed_low_ms, self.timed_high_ms

    @property
    def untraced_step_ms(self) -> float | None:
        return statistics.median(self.untraced_steps_ms) if self.untraced_steps_ms else None

    @property
    def checked_ms(self) -> float:
        """The step held against the timed interval: the untraced steps' median where the record has them."""
        untraced = self.untraced_step_ms
        return self.traced_step_ms if untraced is None else untraced

    @property
    def inside(self) -> bool:
        low, high = self.bounds_ms
        return low <= self.checked_ms <= high

    @property
    def hooks_pct(self) -> float | None:
        """The traced step over the untraced steps' median, in % (None where the record has no untraced steps)."""
        untraced = self.untraced_step_ms
        return None if not untraced else 100 * (self.traced_step_ms / untraced - 1)

    @property
    def hooks_unbounded(self) -> bool:
        """The traced steps' median lies below the untraced ones' around them: hooks only add time, so this process's
        speed moved between the two sets of steps, and their difference bounds nothing of the hooks."""
        traced, untraced = self.traced_steps_ms, self.untraced_steps_ms
        return bool(traced) and bool(untraced) and statistics.median(traced) < statistics.median(untraced)

    @property
    def hooks_high_ms(self) -> float | None:
        """The most the profiler's hooks add to a step at 95 % confidence (never below 0): the high end of the traced
        steps' median interval less the low end of the untraced ones'. None where either has too few steps, or where
        the steps bound nothing of the hooks (`hooks_unbounded`)."""
        traced, untraced = median_interval(self.traced_steps_ms), median_interval(self.untraced_steps_ms)
        if traced is None or untraced is None or self.hooks_unbounded:
            return None
        return max(traced[1] - untraced[0], 0.0)

    def placement_sentence(self) -> str:
        """One sentence: where the checked step lies against the timed interval, and what the hooks added."""
        checked, (low, high) = self.checked_ms, self.bounds_ms
        if self.inside:
            where = "inside"
        elif checked > high:
            where = f"{100 * (checked / high - 1):.1f} % above"
        else:
            where = f"{100 * (1 - checked / low):.1f} % below"
        bounds = f"{low:.3f}-{high:.3f} ms"
        passes = f"{self.attempts} pass{'es' if self.attempts != 1 else ''} traced"
        if self.untraced_step_ms is None:
            traced = f"the traced step took {self.traced_step_ms:.3f} ms"
            return f"{traced}, {where} the timed step's 95 % CI ({bounds}; {passes})"
        against = (
            f"the range one more timing process would run in ({bounds}, 95 % prediction from their medians)"
            if self.expected_high_ms > 0
            else f"the timed step's 95 % CI ({bounds})"
        )
        speed = "" if self.inside else ": this process ran at another speed"
        hooks = signed_tenth(self.hooks_pct or 0.0)
        return (
            f"the {len(self.untraced_steps_ms)} steps run untraced around the traced pass took {checked:.3f} ms "
            f"(median), {where} {against}{speed}; traced, the step took {self.traced_step_ms:.3f} ms, "
            f"{hooks} % ({passes})"
        )


@dataclass(frozen=True)
class ProfileRecord:
    combination: Combination
    hardware: dict[str, str]
    settings: ProfileSettings
    timing: Timing
    conditions: MeasurementConditions  # load, cores, threads, governor around the timing
    block_times_ms: tuple[float, ...]  # per-step time of each timed block, in order (5 significant digits)
    top_operators: tuple[OperatorRow, ...]  # ATen operators only: no profiler ranges, no raw kernels
    data_digest: str
    analysis: StepAnalysis
    format: int = RECORD_FORMAT
    # cuda only: the same step replayed from a CUDA graph, timed on the same clock (empty elsewhere).
    graph_step_times_ms: tuple[float, ...] = ()
    # cpu only, where the stage tuned glibc's allocator itself (None elsewhere and in older records).
    allocator_whatif: AllocatorWhatIf | None = None
    # The median step time of each timing process, in the order they ran (empty in older records).
    process_step_times_ms: tuple[float, ...] = ()
    # The operator table's pass against the timed interval (None in older records).
    trace_check: TraceCheck | None = None
    memory: StepMemory | None = None  # None in older records
    energy: StepEnergy | None = None  # where the device has an energy counter
    energy_unavailable: str = ""  # why there is no energy figure ("" where there is one, and in older records)

    @property
    def traced_like_timed(self) -> bool:
        """The operator table's traced pass ran like the timing processes (True where it was not checked): only then
        do its operator times, anatomy and kernels describe the timed step."""
        return self.trace_check is None or self.trace_check.inside

    @property
    def per_sample(self) -> Interval:
        """The step time's interval per sample (ms)."""
        return self.timing.step_interval * (1.0 / self.combination.batch_size)

    @property
    def energy_per_sample(self) -> Interval | None:
        """Joules per sample with the interval, where the device has an energy counter."""
        return self.energy.per_sample(self.combination.batch_size) if self.energy else None

    @property
    def hooks_per_call_ms(self) -> float | None:
        """On the CPU, the most the profiler's hooks add to one operator call (95 %): their time per step
        (`TraceCheck.hooks_high_ms`) over the step's operator calls, at the same cost per call. None where the hooks
        or the calls were not measured, or the table is of device time (the hooks run on the host)."""
        check, anatomy = self.trace_check, self.analysis.anatomy
        hooks = check.hooks_high_ms if check is not None else None
        if not self.combination.kind.on_host or hooks is None or anatomy.operator_calls_per_step <= 0:
            return None
        return hooks / anatomy.operator_calls_per_step

    @property
    def hooks_share_points(self) -> float | None:
        """The most a share of this table moves, in percentage points, with the hooks' most per call taken off every
        row's calls and off the operator time (`hooks_per_call_ms`); inf where that could be all of the operator
        time; None where not measured."""
        per_call, top = self.hooks_per_call_ms, self.top_operators
        if per_call is None or not top or not top[0].share_pct:
            return None
        operator_ms = 100 * top[0].self_cpu_ms / top[0].share_pct
        left = operator_ms - per_call * self.analysis.anatomy.operator_calls_per_step
        if left <= 0:
            return math.inf
        without = (100 * max(row.self_cpu_ms - row.calls_per_step * per_call, 0.0) / left for row in top)
        return max(abs(row.share_pct - share) for row, share in zip(top, without, strict=True))

    @property
    def top_operator_ranked(self) -> bool:
        """Whether the table's first operator still leads the second with the hooks' most per call taken off each of
        their calls (True where there is no second, or the hooks were not measured)."""
        top, per_call = self.top_operators, self.hooks_per_call_ms
        if per_call is None or len(top) < 2:
            return True
        first, second = (row.self_cpu_ms - row.calls_per_step * per_call for row in top[:2])
        return first > second

    @property
    def allocator_slowdown(self) -> Ratio | None:
        """glibc's defaults ÷ the tuned allocator's step time where the what-if ran: the paired ratio where the record
        has one, else from the two intervals."""
        whatif = self.allocator_whatif
        if whatif is None:
            return None
        if whatif.paired:
            return Ratio(whatif.slowdown, whatif.slowdown_ci_low, whatif.slowdown_ci_high)
        return whatif.step_interval / self.timing.step_interval

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def as_metrics(self) -> dict[str, float]:
        """timing.json, MLflow and TensorBoard: the same names for every combination (graph replay: cuda only)."""
        return {
            **self.timing.as_metrics(),
            **self.conditions.as_metrics(),
            **self.graph_metrics(),
            **self.allocator_metrics(),
            **(self.memory.as_metrics() if self.memory else {}),
            **(self.energy.as_metrics(self.combination.batch_size) if self.energy else {}),
        }

    def allocator_metrics(self) -> dict[str, float]:
        """Where the allocator what-if ran: the step and page faults with glibc's defaults, beside the tuned ones."""
        whatif = self.allocator_whatif
        if whatif is None:
            return {}
        return {
            "default_allocator_step_time_ms_median": whatif.step_time_ms_median,
            "default_allocator_slowdown": whatif.slowdown
            if whatif.paired
            else whatif.step_time_ms_median / self.timing.step_time_ms_median
            if self.timing.step_time_ms_median
            else 0.0,
            "page_faults_per_step": whatif.tuned_page_faults_per_step,
            "default_allocator_page_faults_per_step": whatif.page_faults_per_step,
        }

    def graph_metrics(self) -> dict[str, float]:
        """Where a graph replay was timed: its median step and the host overhead of an eager step.

        Host overhead = eager median - graph median: what launching the step's kernels one by one from Python
        costs beyond the GPU's own work, which a replay leaves out. Empty on other devices.
        """
        if not self.graph_step_times_ms:
            return {}
        graph = statistics.median(self.graph_step_times_ms)
        eager = self.timing.step_time_ms_median
        overhead = eager - graph
        return {
            "graph_step_time_ms_median": graph,
            "host_overhead_ms": overhead,
            "host_overhead_pct": 100.0 * overhead / eager if eager else 0.0,
        }


def run_params(combination: Combination, settings: ProfileSettings, top_k: int) -> dict[str, object]:
    """What the MLflow run of one combination records as params (its record says the same)."""
    return {
        **dataclasses.asdict(combination),
        "threads": settings.threads,
        "precision": settings.precision,
        "memory_format": settings.memory_format,
        "optimizer_lr": settings.optimizer_lr,
        "profile.warmup_steps": settings.warmup_steps,
        "profile.active_steps": settings.active_steps,
        "profile.ci_target_pct": settings.ci_target_pct,
        "profile.time_budget_s": settings.time_budget_s,
        "profile.processes": settings.processes,
        "profile.program_starts": settings.program_starts,
        "profile.processes_at_once": settings.processes_at_once,
        "profile.top_k": top_k,
        "allocator": settings.allocator,
    }


def write_record(record: ProfileRecord) -> str:
    """The record as the JSON text of `profile.json`."""
    return json.dumps(record.as_dict(), indent=2, sort_keys=True) + "\n"


@dataclass(frozen=True)
class PairedComparison:
    """One ratio the report states, measured paired: `numerator` / `denominator`, per sample (batch sizes of one
    mode) or per step (one batch size's two modes), from the same rounds of the same processes."""

    numerator: str  # combination names
    denominator: str
    per: str  # "sample" | "step"
    value: float
    low: float  # 95 % interval
    high: float
    process_values: tuple[float, ...]  # each timing process's ratio, in the order they ran

    @property
    def half_width_pct(self) -> float:
        """The larger side of the 95 % interval in % of the value."""
        return Interval(self.value, self.low, self.high).half_width_pct


@dataclass(frozen=True)
class DeviceComparisons:
    """profiles/<device>/comparisons.json: every paired ratio between the device's combinations."""

    device: str
    processes: int
    comparisons: tuple[PairedComparison, ...]
    # Each timing process's speed, shared by every combination it timed (1 = the median process; 1.1: 10 % slower):
    # the machine's drift within this run, which every row's interval holds and every paired ratio cancels.
    process_speeds: tuple[float, ...] = ()
    format: int = RECORD_FORMAT
    # The training step's parts, timed untraced beside it (pipeline.records.statistics.GRADIENTS): at each batch size
    # profiled in both modes, `<batch>-<device>-train` over `<batch>-<device>-gradients` (the step without its update)
    # and that over `<batch>-<device>-inference`, per step. Empty in a record written before they were timed.
    parts: tuple[PairedComparison, ...] = ()

    @property
    def speed_spread_pct(self) -> float:
        """How far apart the slowest and the fastest process ran, in %."""
        speeds = self.process_speeds
        return 100.0 * (max(speeds) / min(speeds) - 1) if speeds and min(speeds) > 0 else 0.0

    def undecided_names(self) -> frozenset[str]:
        """The combinations whose spread could change a conclusion: those in a paired ratio whose interval holds 1,
        so that its direction is undecided."""
        return frozenset(
            name for c in self.comparisons if c.low <= 1 <= c.high for name in (c.numerator, c.denominator)
        )

    @property
    def by_pair(self) -> dict[tuple[str, str], PairedComparison]:
        """Each ratio under (numerator, denominator), the combinations' names."""
        return {(c.numerator, c.denominator): c for c in self.comparisons}

    def between(self, names: set[str]) -> DeviceComparisons:
        """Only the ratios between the combinations named: a batch size removed from params.yaml leaves none; a part
        stays where its training or inference step is named."""
        kept = tuple(c for c in self.comparisons if c.numerator in names and c.denominator in names)
        parts = tuple(c for c in self.parts if c.numerator in names or c.denominator in names)
        return dataclasses.replace(self, comparisons=kept, parts=parts)

    def part(self, numerator: str, denominator: str) -> PairedComparison | None:
        """The part timed as `numerator` / `denominator` (combination names, GRADIENTS ones included), if timed."""
        return next((c for c in self.parts if (c.numerator, c.denominator) == (numerator, denominator)), None)


def write_comparisons(comparisons: DeviceComparisons) -> str:
    return json.dumps(dataclasses.asdict(comparisons), indent=2, sort_keys=True) + "\n"


def read_typed_json(
    path: Path,
    cls: type[T],
    what: str,
    formats: tuple[int, ...],
    fix: str,
    upgrade: Callable[[dict[str, Any]], dict[str, Any]] = lambda raw: raw,
) -> T:
    """Read a JSON file written from one of the record types (`cls`) by this pipeline: unreadable JSON, another
    format or a field that does not match is a user error naming the file, the problem and `fix`."""
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path} is missing; {fix}") from None
    except json.JSONDecodeError as error:
        raise PipelineError(f"{path} is not valid JSON ({error}); {fix}") from None
    if not isinstance(raw, dict) or raw.get("format") not in formats:
        raise PipelineError(f"{path} is not a {what} of format {formats[-1]} from this pipeline; {fix}")
    try:
        found: T = build(cls, upgrade(raw), "", RecordDialect())
    except RecordMismatch as error:
        raise PipelineError(f"{path} does not match this pipeline's {what} ({error}); {fix}") from None
    return found


def read_comparisons(path: Path, device: str) -> DeviceComparisons:
    """Read `comparisons.json`; a missing field or another device's file is a user error naming the fix."""
    fix = f"rerun `dvc repro -f profile@{device}`."
    comparisons = read_typed_json(path, DeviceComparisons, "comparison record", COMPARISON_FORMATS, fix)
    if comparisons.device != device:
        raise PipelineError(f"{path} holds device {comparisons.device}, not {device}; {fix}")
    return comparisons


def read_record(path: Path, combination: Combination) -> ProfileRecord:
    """Read `profile.json`; a missing, foreign or outdated file is a user error naming the fix."""
    fix = f"rerun `dvc repro -f {combination.stage_name}`."
    record = read_typed_json(path, ProfileRecord, "profile record", READABLE_FORMATS, fix, _upgrade)
    if record.combination != combination:
        raise PipelineError(f"{path} holds combination {record.combination.name}, not {combination.name}; {fix}")
    return record


@dataclass(frozen=True)
class ProfileInputs:
    """What the profile stages left for a reader, as params.yaml asks for it (in its order), and one sentence per
    missing file, naming the command that writes it."""

    records: list[ProfileRecord]
    comparisons: list[DeviceComparisons]  # one per profiled device
    missing: list[str]


def read_profiles(config: ProfileConfig) -> ProfileInputs:
    """Every combination's record and every device's paired comparisons that `config` asks for and exist."""
    wanted = profile_matrix(config)
    records, comparisons, missing = [], [], []
    for combination in wanted:
        path = combination.outputs.record
        if path.exists():
            records.append(read_record(path, combination))
        else:
            missing.append(f"`{path}` is missing: run `dvc repro {combination.stage_name}`.")
    for device in config.devices:
        path = DeviceProfileOutputs(device).comparisons
        if path.exists():
            comparisons.append(read_comparisons(path, device).between({c.name for c in wanted}))
        else:
            missing.append(f"`{path}` is missing: run `dvc repro profile@{device}`.")
    return ProfileInputs(records, comparisons, missing)


def _upgrade(raw: dict[str, Any]) -> dict[str, Any]:
    """A format-2 record in this format's terms; its `format` stays 2, so readers can tell how its FLOPs were got.

    Format 2 wrote 0 for "no number": MFLOPs of operators without a profiler formula, GPU times on the CPU.
    """
    timing = raw.get("timing")
    if raw.get("format") in (2, 3, 4, 5) and isinstance(timing, dict) and "drift_pct" in timing:
        raw = {**raw, "timing": {key: value for key, value in timing.items() if key != "drift_pct"}}
    if raw.get("format") != 2:
        return raw
    combination = raw.get("combination")
    on_cpu = isinstance(combination, dict) and device_kind(str(combination.get("device"))).on_host
    rows = raw.get("top_operators")
    if not isinstance(rows, list):
        return raw  # the walk names the problem
    upgraded = []
    for row in rows:
        if isinstance(row, dict):
            row = dict(row)
            if row.get("mflops") == 0:
                row["mflops"] = None
            for field in ("self_device_ms", "total_device_ms"):
                if on_cpu and row.get(field) == 0:
                    row[field] = None
        upgraded.append(row)
    return {**raw, "top_operators": upgraded}


class RecordMismatch(ValueError):
    """The first way a record differs from the record types (read_record names the file and the fix)."""


class RecordDialect(Dialect):
    """The record's words: fields named by their class (`OperatorRow.mflops`); the first problem stops."""

    def report(self, message: str) -> None:
        raise RecordMismatch(message)

    def field_key(self, parent: str, cls: type, name: str) -> str:
        return f"{cls.__name__}.{name}"

    def not_mapping(self, key: str, cls: type, value: Any) -> str:
        return f"{cls.__name__} must be an object, got {type(value).__name__}"

    def unknown(self, key: str, cls: type, unknown: list[Any], allowed: list[str]) -> list[str]:
        return [f"unknown field(s) {unknown} in {cls.__name__}"]

    def wrong_type(self, key: str, hint: Any, value: Any) -> str:
        if typing.get_origin(hint) is dict:
            return f"{key} must be an object of strings"
        return f"{key} must be {getattr(hint, '__name__', hint)}, got {type(value).__name__}"


def parse_combination(arguments: list[str]) -> Combination:
    """A combination's name split at its dashes (`16-cpu-train`: MLflow run names, the folders of runs from before
    the per-device layout) as a Combination, each part checked, naming the params.yaml key it comes from."""
    if len(arguments) != 3:
        raise PipelineError(f"expected 3 parts (batch, device, mode), got {len(arguments)}: {arguments!r}.")
    batch, device, mode = arguments
    if not batch.isdigit() or int(batch) < 1:
        raise PipelineError(f"`profile.batch_sizes` entry {batch!r} is not a whole number >= 1; fix it in params.yaml.")
    devices, modes = device_names(), typing.get_args(ProfileMode)
    if device not in devices:
        raise PipelineError(f"`profile.devices` entry {device!r} is not one of {list(devices)}; fix it in params.yaml.")
    if mode not in modes:
        raise PipelineError(f"`profile.modes` entry {mode!r} is not one of {list(modes)}; fix it in params.yaml.")
    return Combination(int(batch), device, typing.cast(ProfileMode, mode))
