"""The numbers a profile record holds, as types: an estimate with its interval and a ratio of two, the step time
estimate, the conditions a measurement ran in, and what a trace says of a step (its anatomy, its kernels, its
profiler ranges).

The contract between the profile stage and its readers (pipeline.records.profile, the report): torch-free, and
free of any analysis, which produces these values (pipeline.records.statistics, pipeline.profiling.trace_analysis)
and imports them from here.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from pipeline.devices.registry import device_kind


@dataclass(frozen=True)
class Interval:
    """A point estimate and its confidence interval, in one unit (ms, or a unitless ratio)."""

    value: float
    low: float
    high: float

    @property
    def half_width_pct(self) -> float:
        """The larger side of the interval in % of the value: the interval lies within value ± this."""
        if self.value <= 0:
            return math.inf
        return 100.0 * max(self.value - self.low, self.high - self.value) / self.value

    def __mul__(self, factor: float) -> Interval:
        """The same estimate in another unit (factor > 0): per step -> per sample is `step * (1 / batch)`."""
        return Interval(self.value * factor, self.low * factor, self.high * factor)

    def __truediv__(self, denominator: Interval) -> Ratio:
        """This estimate over another, as a Ratio whose interval comes from both intervals' ends."""
        if min(self.low, denominator.low, self.value, denominator.value) <= 0:
            # An interval reaching 0 (too few blocks) or a zero time: the data bound nothing.
            value = self.value / denominator.value if denominator.value > 0 else math.inf
            return Ratio(value, 0.0, math.inf)
        return Ratio(self.value / denominator.value, self.low / denominator.high, self.high / denominator.low)

    def overlaps(self, other: Interval) -> bool:
        return self.low <= other.high and other.low <= self.high


@dataclass(frozen=True)
class StepEstimate:
    """What one combination's timing says: the median step time, its spread and its uncertainty."""

    batch_size: int
    median_ms: float  # per step: median of the blocks' per-step means
    iqr_ms: float  # interquartile range of the blocks' per-step means (their spread, not the uncertainty)
    ci_low_ms: float  # 95 % confidence interval of the median
    ci_high_ms: float
    steps: int  # measured, over all blocks
    blocks: int
    ci_target_pct: float
    processes: int = 1  # fresh processes timed; with more than one, the interval is the spread between them

    @property
    def interval(self) -> Interval:
        return Interval(self.median_ms, self.ci_low_ms, self.ci_high_ms)

    @property
    def ci_half_width_pct(self) -> float:
        return self.interval.half_width_pct

    @property
    def noisy(self) -> bool:
        """The interval is wider than `ci_target_pct`: with several processes, they disagree by more than the
        target (each settled at its own speed); in one process, its blocks did before the budget ran out."""
        return not self.ci_half_width_pct <= self.ci_target_pct

    @property
    def per_sample(self) -> Interval:
        return self.interval * (1.0 / self.batch_size)

    @property
    def throughput_samples_per_s(self) -> float:
        return 1000.0 * self.batch_size / self.median_ms


@dataclass(frozen=True)
class Ratio:
    """numerator / denominator of two estimates, with an interval built from both intervals' ends.

    [low_a / high_b, high_a / low_b] covers the true ratio whenever both intervals cover their true
    values (at least 0.95² ≈ 90 % for two independent 95 % intervals; more in practice, as both
    would have to miss on opposite sides). It contains 1 exactly when the two intervals overlap, so
    "the data cannot tell them apart" and the printed interval can never disagree.
    """

    value: float
    low: float
    high: float

    @property
    def measurable(self) -> bool:
        """False when the data cannot tell the two apart (the interval contains 1)."""
        return not self.low <= 1.0 <= self.high

    @property
    def half_width_pct(self) -> float:
        """The larger side of the interval in % of the value."""
        return Interval(self.value, self.low, self.high).half_width_pct

    def bounds(self) -> str:
        """`2.95-3.30x` (the 95 % interval), or a note that the data bound nothing."""
        if not math.isfinite(self.high):
            return "too few timed blocks to bound the ratio"
        return f"{_format_ratio(self.low)}-{_format_ratio(self.high)}x"

    def with_interval(self) -> str:
        """`3.12x (2.95-3.30x)`, or `1.01x; the data cannot tell them apart (0.97-1.04x)` when the interval contains
        1 (the median still shown: a wide interval around a large median says the data cannot tell, not that there is
        no effect)."""
        if not self.measurable:
            if not math.isfinite(self.high):
                return f"the data cannot tell them apart ({self.bounds()})"
            return f"{_format_ratio(self.value)}x; the data cannot tell them apart ({self.bounds()})"
        return f"{_format_ratio(self.value)}x ({self.bounds()})"


def rounded_up(value: float, digits: int) -> float:
    """`value` rounded up at `digits` decimals: an upper bound printed never below what it bounds."""
    return float(math.ceil(round(value * 10**digits, 9)) / 10**digits)  # 9.522000000000002 is 9.522, not 9.523


def rounded_down(value: float, digits: int) -> float:
    """`value` rounded down at `digits` decimals: a lower bound printed never above what it bounds."""
    return float(math.floor(round(value * 10**digits, 9)) / 10**digits)


def signed_tenth(value: float) -> str:
    """`+1.2`, `-0.3`; a value that rounds to zero from below reads `+0.0`, never `-0.0`."""
    return f"{round(value, 1) + 0.0:+.1f}"


def _format_ratio(value: float) -> str:
    return f"{value:.2f}" if value < 100 else f"{value:.0f}"


GOVERNOR_NOT_EXPOSED = "not exposed"  # most VMs have no cpufreq interface


@dataclass(frozen=True)
class MeasurementConditions:
    """The machine's state around a measurement: what a reader needs to trust (or distrust) it.

    Plain int/float/str fields: it is stored as is in the profile record (pipeline.records.profile).
    """

    load_average_before: float  # 1-minute load average (runnable + waiting threads), includes this process
    load_average_after: float
    cores: int  # CPUs this process may run on
    threads: int  # torch intra-op threads used while timing
    cpu_governor: str  # CPU frequency governor, or GOVERNOR_NOT_EXPOSED

    @property
    def busy(self) -> bool:
        """More runnable threads than cores: the measured steps had to share the CPUs."""
        return max(self.load_average_before, self.load_average_after) > self.cores

    def warning(self, measured: str = "step times") -> str | None:
        """What a busy machine did to the `measured` numbers; None on a quiet one."""
        if not self.busy:
            return None
        return (
            f"the machine was busy while measuring (load average {self.load_average_before:.2f} before, "
            f"{self.load_average_after:.2f} after, on {self.cores} cores): {measured} are likely inflated and "
            "less stable; rerun on a quiet machine"
        )

    def as_metrics(self) -> dict[str, float]:
        return {
            "load_average_before": self.load_average_before,
            "load_average_after": self.load_average_after,
            "machine_busy": float(self.busy),
        }


HOST_BOUND_BELOW_PCT = 50.0  # busy share under which a step is called host-bound (see StepAnatomy.verdict)


@dataclass(frozen=True)
class RangeStats:
    """A profiler range (record_function / user annotation): listed apart, never ranked with operators."""

    name: str
    calls_per_step: float
    cpu_ms: float  # its span on the CPU, per step
    device_ms: float  # kernels launched inside it, per step


@dataclass(frozen=True)
class KernelStats:
    """One GPU kernel (or copy / memset), per traced step."""

    kernel: str  # short readable name
    launches_per_step: float
    device_ms: float  # GPU time per step
    mean_us: float  # per launch
    share_pct: float  # of all device activity time (the GPU's busy time when nothing overlaps, as on one stream)
    launched_by: str  # the ATen operators whose calls launched it, most time first
    full_name: str


@dataclass(frozen=True)
class StepAnatomy:
    """Where a step's wall time goes.

    `busy` is, on a GPU, the union of kernel/copy/memset intervals inside the step; on the CPU, the
    union of the ATen operators' intervals (the step's time inside operators). `idle_pct` is the rest:
    on a GPU the time it waits for the host to launch work, on the CPU the time spent in Python, the
    autograd engine and the optimizer's loop between operators.
    """

    device: str  # cpu | cuda
    traced_steps: int
    step_ms: float  # median ProfilerStep span (traced: the profiler's hooks make it longer than untimed steps)
    busy_ms: float  # per step, mean
    busy_pct: float  # total busy time / total step span
    idle_pct: float
    launches_per_step: float  # device activities per step (kernels, copies, memsets); 0 on the CPU
    mean_launch_us: float  # mean device activity length; 0 on the CPU
    launch_call_ms: float  # per step, CPU time in the calls that launched device work (cudaLaunchKernel & co.)
    verdict: str  # anatomy_verdict's words when the record was written (`words`: this version's)
    reason: str  # one line with the numbers behind the verdict
    operator_calls_per_step: float = 0.0  # ATen operator calls per traced step, wrappers included (0 in older records)

    @property
    def host_bound(self) -> bool:
        """Most of the step is spent outside the device's work (GPU idle; CPU outside ATen operators)."""
        return self.busy_pct < HOST_BOUND_BELOW_PCT

    @property
    def words(self) -> str:
        """The verdict in this version's words, whatever words the record was written with."""
        return anatomy_verdict(self.device, self.busy_pct)

    @property
    def mean_step_ms(self) -> float:
        """The traced steps' mean: what `busy_pct` is a share of (their total busy time over their total span)."""
        return 100.0 * self.busy_ms / self.busy_pct if self.busy_pct > 0 else self.step_ms

    def explained(self, on_host: bool) -> str:
        """The numbers behind the verdict, each share named with the step time it is of (the traced steps' mean;
        the median traced step beside it, as the tables give it)."""
        of = (
            f"of the traced steps' time (a mean of {self.mean_step_ms:.3f} ms a step; the median step "
            f"{self.step_ms:.3f} ms)"
        )
        if on_host:
            return (
                f"{self.busy_pct:.1f} % {of} is inside ATen operators, {self.idle_pct:.1f} % outside them (Python and "
                "framework code between operators, and the profiler's own hooks)"
            )
        if self.host_bound:
            return (
                f"the GPU is busy {self.busy_pct:.1f} % {of} ({self.launches_per_step:.0f} kernels/copies of "
                f"{self.mean_launch_us:.1f} µs mean) and idle {self.idle_pct:.1f} % waiting for the host to launch work"
            )
        return f"the GPU is busy {self.busy_pct:.1f} % {of}: its arithmetic sets the pace"


def anatomy_verdict(device: str, busy_pct: float) -> str:
    """On a GPU: `host-bound` (the GPU is idle most of the step, waiting for launches) or `GPU-bound`. On a CPU
    there is no second device to wait for: `overhead-bound` (most of the step is Python and framework code between
    ATen operators) or `operator-bound` (the operators' own work sets the pace)."""
    if device_kind(device).on_host:
        return "overhead-bound" if busy_pct < HOST_BOUND_BELOW_PCT else "operator-bound"
    return "host-bound" if busy_pct < HOST_BOUND_BELOW_PCT else "GPU-bound"


# The parts a step is split into (pipeline.profiling.trace_analysis.step_parts): each ATen operator goes to the phase
# it ran in (the optimizer's step and zero_grad ranges, an autograd node of the backward pass, else the forward) and
# to the group of the layer it serves, named by its outermost operator or autograd node. On the CPU a part's time is
# its operators' self CPU time; on a GPU their kernels' time. "outside" is the rest of the traced step: on the CPU
# Python and framework code between operators, on a GPU the time no kernel ran.
STEP_PHASES = ("forward", "backward", "optimizer", "outside")
STEP_GROUPS = ("convolution", "linear", "pool_activation_dropout", "loss", "optimizer", "other", "outside")


@dataclass(frozen=True)
class StepPart:
    """One phase x group of the step, in every traced step (so a reader can put an interval on it)."""

    phase: str  # one of STEP_PHASES
    group: str  # one of STEP_GROUPS
    step_ms: tuple[float, ...]  # its time in each traced step, in order
    mflops: float | None = None  # per step, the FLOPs its operators ran (None: none counted)


MEGABYTE = 1e6  # memory is stated in MB of 10^6 bytes: 1.2 M fp32 parameters are 4.8 MB
# What a step holds at its peak, in the order the report lists them (pipeline.profiling.memory sorts the bytes).
MEMORY_PARTS = (
    "weights",  # the model's parameters
    "gradients",  # the parameters' gradients alive at the peak
    "optimizer state",  # Adadelta's two running averages per parameter
    "inputs",  # the batch's images and labels
    "activations",  # layer outputs, and tensors autograd saved for the backward pass
    "activation gradients",  # gradients of the activations, made by the backward pass
    "optimizer temporaries",  # made inside the optimizer's step and freed by it
    "other",  # anything else: the loss, scratch buffers of the kernels
)


@dataclass(frozen=True)
class MemoryPart:
    name: str  # one of MEMORY_PARTS
    bytes: int


@dataclass(frozen=True)
class StepMemory:
    """What one step of a combination holds in the device's memory at its peak, by part (pipeline.profiling.memory).

    `peak_bytes` is the combination's own: what it held when the step started (weights, optimizer state, the batch,
    the last step's gradients) plus the most the step's allocations added on top, from the allocator's own record of
    every allocation and free. Other combinations timed in the same process are not in it. The parts add up to it.
    """

    peak_bytes: int
    start_bytes: int  # held when the step started
    parts: tuple[MemoryPart, ...]  # alive at the peak, in MEMORY_PARTS order; they add up to peak_bytes
    step_gradient_bytes: int  # every gradient the step made (train: the parameters' bytes; inference: 0)
    resident_bytes: int  # what the process holds from the system (see resident_of)
    resident_of: str  # what resident_bytes counts, in words
    peak_low_bytes: int  # the peak in the process that measured the least, and the most
    peak_high_bytes: int
    processes: int = 1  # processes that measured it
    # CUDA: torch.cuda.max_memory_allocated over the step less memory_allocated at its start, the caching allocator's
    # own statistic (it should equal peak_above_start_bytes); None on the CPU, whose allocator keeps no statistics.
    allocator_peak_above_start_bytes: int | None = None

    @property
    def peak_above_start_bytes(self) -> int:
        return self.peak_bytes - self.start_bytes

    @property
    def peak_mb(self) -> float:
        return self.peak_bytes / MEGABYTE

    @property
    def bytes_of(self) -> dict[str, int]:
        """Bytes per part, by name, for every name of MEMORY_PARTS (0 where the step held none of it)."""
        return {name: 0 for name in MEMORY_PARTS} | {part.name: part.bytes for part in self.parts}

    def as_metrics(self) -> dict[str, float]:
        """`memory_peak_mb`, `memory_<part>_mb`, ...: the same names for every combination."""
        parts = {f"memory_{part.name.replace(' ', '_')}_mb": part.bytes / MEGABYTE for part in self.parts}
        return {
            "memory_peak_mb": self.peak_mb,
            "memory_peak_above_start_mb": self.peak_above_start_bytes / MEGABYTE,
            **parts,
            "memory_resident_mb": self.resident_bytes / MEGABYTE,
            **(
                {"memory_allocator_peak_above_start_mb": self.allocator_peak_above_start_bytes / MEGABYTE}
                if self.allocator_peak_above_start_bytes is not None
                else {}
            ),
        }


@dataclass(frozen=True)
class StepEnergy:
    """Energy one step draws: its power, fitted from a hardware energy counter polled during the timing, times its
    step time in the same process (pipeline.profiling.energy_during_timing).

    The interval is the spread of the timing processes' values, as for the step time."""

    joules_per_step: float  # median over processes
    joules_per_step_low: float  # 95 % interval (the processes' spread)
    joules_per_step_high: float
    mean_power_w: float  # the step's fitted power, median over processes
    counter: str  # which counter, in words (NVML's total energy of GPU 0; a RAPL package domain)
    update_period_ms: float  # how often the counter moved, measured on this device
    windows: int  # the counter's update intervals the fits used, over all processes
    processes: int
    power_limit_w: float | None = None  # GPU: the enforced power limit; None where not read
    sm_clock_mhz: float | None = None  # GPU: clocks when measured
    memory_clock_mhz: float | None = None

    def per_sample(self, batch_size: int) -> Interval:
        return Interval(self.joules_per_step, self.joules_per_step_low, self.joules_per_step_high) * (1.0 / batch_size)

    def as_metrics(self, batch_size: int) -> dict[str, float]:
        sample = self.per_sample(batch_size)
        return {
            "energy_j_per_step": self.joules_per_step,
            "energy_j_per_sample": sample.value,
            "energy_j_per_sample_ci_low": sample.low,
            "energy_j_per_sample_ci_high": sample.high,
            "energy_mean_power_w": self.mean_power_w,
        }
