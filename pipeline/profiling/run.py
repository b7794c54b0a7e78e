"""Profile every batch size × mode of one device: step times and their paired ratios, then torch.profiler's
operator table of each combination.

First every combination is timed with no profiler attached (profiler hooks would inflate the times), interleaved
in the same fresh processes (pipeline.profiling.processes): each combination's step time with its interval, and
each ratio the report states measured paired. Then, in this process, after an untimed warm-up (oneDNN/cuDNN
create kernels per input shape, so a cold first step can cost many warm ones), `active_steps` steps of each
combination are traced by torch.profiler for the Chrome/Perfetto trace, with as many steps run untraced around
the traced pass (half before, half after) in the same process: those are checked against where one more timing
process would run (does this process run like them?), and the traced step against them (what the profiler's hooks
add), in `TraceCheck`.
The operator table, kernel table and step anatomy are read from that trace (pipeline.profiling.trace_analysis:
each microsecond counted once, profiler ranges kept apart). One more step runs under
torch.utils.flop_counter, whose FLOPs per call (convolutions and matrix products, forward and backward)
the analysis credits to the traced operators that run them. The ceiling the step's achieved FLOP/s is compared
with is the device's matmul roof, measured once per machine by the `roofs` stage (pipeline.profiling.peak).

Why not the profiler's own `with_flops`: in torch 2.15 it credits a convolution's forward FLOPs to the
`aten::conv2d` wrapper (0 on `aten::mkldnn_convolution` / `aten::cudnn_convolution`, which do the work),
has no formula for `aten::convolution_backward`, and counts the optimizer's element-wise `aten::add` /
`aten::mul`, which the model summary's FLOPs leave out: its per-row numbers neither show where the work is
nor add up to the model's FLOPs per step.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import math
import os
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile, schedule
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.flop_counter import FlopCounterMode, flop_registry

from pipeline.common.allocator import glibc_defaults, plan_allocator, tune_allocator
from pipeline.common.errors import PipelineError
from pipeline.common.interrupts import pause_at
from pipeline.common.native_stderr import filtered_native_stderr
from pipeline.data.mnist import load_split
from pipeline.data.tensors import MEMORY_FORMAT, normalize_images
from pipeline.devices.counters import GpuPowerState, Unavailable
from pipeline.devices.registry import kind_of
from pipeline.model.checkpoint import checkpoint_digest, load_checkpoint
from pipeline.model.summary import summarize
from pipeline.params.schema import ProfileConfig
from pipeline.profiling.artifacts import RunDescription
from pipeline.profiling.memory import BuiltStep, measure_step_memory
from pipeline.profiling.processes import PairedTiming, WorkerServer, processes_at_once, time_in_processes
from pipeline.profiling.timing import StepTiming, page_faults_per_step, synchronizer, time_steps
from pipeline.profiling.trace_analysis import (
    CountedCall,
    OperatorStats,
    Trace,
    TraceAnalysis,
    analyse_trace,
    read_trace,
)
from pipeline.profiling.worker import WorkerSpec, build_step
from pipeline.records.profile import (
    PROFILE_PRECISION,
    TRACE_ATTEMPTS,
    AllocatorWhatIf,
    Combination,
    DeviceComparisons,
    OperatorRow,
    OperatorShare,
    PairedComparison,
    ProfileRecord,
    ProfileSettings,
    StepAnalysis,
    Timing,
    TraceCheck,
    flop_rate,
    run_params,
)
from pipeline.records.quantities import StepEnergy, StepMemory
from pipeline.records.roofs import DeviceRoofs, read_roofs
from pipeline.records.statistics import (
    GRADIENTS,
    Block,
    PairedRatio,
    comparison_pairs,
    gradient_items,
    paired_ratio,
    prediction_interval,
    ratio_over_pairs,
)
from pipeline.tracking.tags import DATA_DIGEST_TAG, MODEL_DIGEST_TAG, hardware_tags
from pipeline.training.cuda_graph import make_graphable_step, time_graph_replays
from pipeline.training.runtime import hardware_description, select_device


@dataclass(frozen=True)
class ProfileResult:
    combination: Combination
    step_timing: StepTiming
    operators: tuple[OperatorRow, ...]  # every ATen operator, most expensive first
    memory: StepMemory  # what the step holds at its peak, by part
    analysis: TraceAnalysis  # what the trace says: operators, ranges, kernels, step anatomy
    page_faults_per_step: float  # minor page faults per step, counted after the timing
    bytes_per_step: float = 0.0  # what every operator of one step reads and writes (StepWork)
    trace_check: TraceCheck | None = None
    update_bytes_per_step: float = 0.0  # what the optimizer's update alone reads and writes (train mode; else 0)

    def timing(self) -> Timing:
        top = self.operators[0] if self.operators else None
        return self.step_timing.record(self.memory.peak_mb, top.share_pct if top else 0.0)

    def block_times_ms(self) -> tuple[float, ...]:
        """Per-step time of each block, to 5 significant digits (a record of ~1000 blocks stays ~10 kB)."""
        return tuple(float(f"{block.step_ms:.5g}") for block in self.step_timing.blocks)


def profile_combination(
    combination: Combination,
    built: BuiltStep,
    device: torch.device,
    warmup_steps: int,
    active_steps: int,
    trace_path: Path,
    *,
    ci_target_pct: float,
    time_budget_s: float,
    step_timing: StepTiming | None = None,
    memory: StepMemory | None = None,
) -> ProfileResult:
    """Warm up, time and measure the memory (unless `step_timing` and `memory` were measured already, in worker
    processes), then count page faults, trace (again, up to TRACE_ATTEMPTS passes, until the traced step lies inside
    the timed interval) and count FLOPs in this process."""
    step = built.run
    sync = synchronizer(device)
    for _ in range(warmup_steps):
        step()
    sync()
    if memory is None:
        memory = measure_step_memory(built, device, sync)
    if step_timing is None:
        step_timing = time_steps(step, device, combination.batch_size, ci_target_pct, time_budget_s)
    faults = page_faults_per_step(step, sync, step_timing.estimate.median_ms)
    on_gpu = not kind_of(device).on_host
    check, trace = trace_until_timed(step, sync, on_gpu, active_steps, trace_path, step_timing)
    work = count_step_flops(step)
    update_bytes = count_update_bytes(built) if built.optimizer is not None else 0.0
    sync()
    analysis = analyse_trace(trace, combination.device, work.calls)
    return ProfileResult(
        combination=combination,
        step_timing=step_timing,
        operators=tuple(operator_row(row, on_gpu) for row in analysis.operators),
        memory=memory,
        analysis=analysis,
        page_faults_per_step=faults,
        bytes_per_step=work.bytes_per_step,
        trace_check=check,
        update_bytes_per_step=update_bytes,
    )


def trace_until_timed(
    step: Callable[[], None],
    sync: Callable[[], None],
    on_gpu: bool,
    steps: int,
    path: Path,
    timing: StepTiming,
    attempts: int = TRACE_ATTEMPTS,
) -> tuple[TraceCheck, Trace]:
    """Trace into `path` until the steps run untraced beside the traced pass lie where one more timing process would
    run (95 % prediction from the processes' medians; the timed interval where there was one process): this process
    then runs like the timing processes, and the traced step differs from it by the profiler's hooks. At most
    `attempts` passes; keep the first pass inside, else the one closest to it (on the log scale). Returns the check
    and the kept pass, read."""
    low, high = timing.estimate.ci_low_ms, timing.estimate.ci_high_ms
    expected = prediction_interval(timing.process_medians_ms)
    bound_low, bound_high = expected or (low, high)
    best: tuple[float, list[float], Trace] | None = None  # (distance, untraced steps' ms, the pass)
    for attempt in range(1, attempts + 1):
        candidate = path.with_name(f"pass{attempt}-{path.name.removesuffix('.gz')}")  # plain JSON: `_keep` gzips
        around = untraced_steps_ms(step, sync, (steps + 1) // 2)
        trace_steps(step, sync, on_gpu, steps, candidate)
        around += untraced_steps_ms(step, sync, steps // 2 + 1)
        around = [float(f"{ms:.5g}") for ms in around]  # as the record keeps them: its check reads the same values
        speed = statistics.median(around)
        trace = read_trace(candidate)
        # How far outside, on the log scale; an interval whose low end is 0 (too few blocks) bounds only above.
        distance = (
            math.log(speed / bound_high)
            if speed > bound_high
            else math.log(bound_low / speed)
            if speed < bound_low
            else 0.0
        )
        if best is None or distance < best[0]:
            best = (distance, around, trace)
            _keep(candidate, path)
        else:
            candidate.unlink()
        if distance == 0.0:
            break
    assert best is not None
    _, around, trace = best
    traced = tuple(float(f"{event.duration_us / 1000:.5g}") for event in trace.steps)
    untraced = tuple(around)
    check = TraceCheck(trace.median_step_ms(), low, high, attempt, untraced, traced, *(expected or (0.0, 0.0)))
    return check, trace


def _keep(trace: Path, path: Path) -> None:
    """Move the plain JSON `trace` to `path`, gzipped where `path` ends in .gz: in one call, at level 6 (torch's own
    .gz export feeds gzip line by line at level 9: 0.3 s for a training step's 2.5 MB trace against 0.02 s so); mtime
    0, so that the same trace gives the same bytes."""
    if path.name.endswith(".gz"):
        path.write_bytes(gzip.compress(trace.read_bytes(), compresslevel=6, mtime=0))
        trace.unlink()
    else:
        os.replace(trace, path)


def untraced_steps_ms(step: Callable[[], None], sync: Callable[[], None], steps: int) -> list[float]:
    """Each of `steps` steps' wall time in ms, as a ProfilerStep span measures it: from one step's start (after the
    previous one synchronised) to the next's."""
    times = []
    started = time.perf_counter()
    for _ in range(steps):
        step()
        sync()
        now = time.perf_counter()
        times.append(1000 * (now - started))
        started = now
    return times


def trace_steps(step: Callable[[], None], sync: Callable[[], None], on_gpu: bool, steps: int, path: Path) -> None:
    """Trace `steps` steps with torch.profiler into the Chrome trace `path`."""
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    # wait 1 + warmup 1: the profiler's own start-up stays out of the traced steps. One cycle (repeat=1), so
    # keeping its events (acc_events) changes nothing, and torch 2.11 (the GPU image) then makes no needless
    # "Profiler clears events" warning (pytorch/pytorch#180348).
    # Kineto's progress lines and its no-GPU-driver message stay out of the console (pipeline.common.native_stderr).
    # No `with_flops`: FLOPs are counted apart (count_step_flops; the module docstring says why).
    with filtered_native_stderr():
        with profile(
            activities=activities,
            schedule=schedule(wait=1, warmup=1, active=steps, repeat=1),
            profile_memory=True,
            acc_events=True,
        ) as profiler:
            for _ in range(2 + steps):
                step()
                sync()
                profiler.step()
        profiler.export_chrome_trace(str(path))


@dataclass(frozen=True)
class StepWork:
    """What one step computes and moves: each FLOP-counted call (with its bytes) and every operator's bytes."""

    calls: tuple[CountedCall, ...]  # in call order
    bytes_per_step: float  # inputs, weights and outputs of every operator that is not a view


def tensor_bytes(*trees: object) -> float:
    """Bytes of the tensors in `trees` (nested args, kwargs, outputs), each as often as it appears."""
    return float(
        sum(leaf.numel() * leaf.element_size() for leaf in tree_leaves(trees) if isinstance(leaf, torch.Tensor))
    )


class _StepTraffic(TorchDispatchMode):  # type: ignore[no-untyped-call]  # torch's class is untyped
    """Adds up the bytes every ATen operator of a step reads and writes; views (reshape, transpose, detach...)
    alias their input and move nothing."""

    def __init__(self) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.bytes = 0.0

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None
    ) -> Any:
        out = func(*args, **(kwargs or {}))
        if not func.is_view:
            self.bytes += tensor_bytes(args, kwargs, out)
        return out


def count_step_flops(step: Callable[[], None]) -> StepWork:
    """Run `step` once under torch.utils.flop_counter and list each counted call's FLOPs and bytes in call order,
    with the bytes all operators of the step move.

    The counter's formulas (convolution, convolution_backward, mm, addmm, bmm, attention, ...) are the
    ones the model summary's FLOPs come from; each is wrapped to also note the call and its tensors' bytes
    (inputs, weights, outputs: the roofline's arithmetic intensity is FLOPs over them), so that the trace
    analysis can credit every call to the traced operator that ran it. The step is a real one (in train
    mode the optimizer updates the weights once more), run outside the timed and traced passes.
    """
    calls: list[CountedCall] = []

    def recording(operator: str, formula: Callable[..., int]) -> Callable[..., int]:
        def count(*args: Any, out_val: Any = None, **kwargs: Any) -> int:
            flops = formula(*args, out_val=out_val, **kwargs)
            calls.append(CountedCall(operator, float(flops), tensor_bytes(args, kwargs, out_val)))
            return flops

        count._get_raw = True  # type: ignore[attr-defined]  # FlopCounterMode: already takes (args, out_val)
        return count

    # `aten.convolution_backward` -> `aten::convolution_backward`, the name the trace gives the operator.
    mapping = {
        packet: recording(str(packet).replace(".", "::", 1), formula) for packet, formula in flop_registry.items()
    }
    with FlopCounterMode(display=False, custom_mapping=mapping), _StepTraffic() as traffic:
        step()
    return StepWork(calls=tuple(calls), bytes_per_step=traffic.bytes)


def count_update_bytes(built: BuiltStep) -> float:
    """Bytes the optimizer's update reads and writes in one step: every non-view ATen operator of `optimizer.step()`
    (each operand once, as `_StepTraffic` counts them), after a whole real step has left gradients and state to
    update; the update is then applied once more, outside the timed and traced passes."""
    assert built.optimizer is not None
    built.run()
    with _StepTraffic() as traffic:
        built.optimizer.step()
    return float(traffic.bytes)


def operator_row(stats: OperatorStats, on_gpu: bool) -> OperatorRow:
    """The record's row of an analysed operator: no GPU times where no GPU was traced (None, not 0)."""
    row = OperatorRow(**dataclasses.asdict(stats))
    return row if on_gpu else dataclasses.replace(row, self_device_ms=None, total_device_ms=None)


@dataclass(frozen=True)
class ProfileSetup:
    """Everything one combination is measured with, resolved from params, checkpoint and data."""

    combination: Combination
    device: torch.device
    step: BuiltStep
    hardware: dict[str, str]
    settings: ProfileSettings
    data_digest: str
    flops_per_sample: float  # the model's forward FLOPs (inference) or forward + backward FLOPs (train)
    model_digest: str  # SHA-256 of the checkpoint file: which weights were profiled, on any machine
    graph_step: Callable[[], None] | None = None  # cuda: the same step, capturable, on a copy of the model
    roofs: DeviceRoofs | None = None  # the device's measured roofs (hardware/roofs.json); None: not measured


def prepare_profiles(
    combinations: Sequence[Combination],
    config: ProfileConfig,
    checkpoint_path: Path,
    data_root: Path,
    roofs_path: Path | None = None,
) -> list[ProfileSetup]:
    """Pick the device and threads, load the trained model and the test images once, and give each combination its
    own copy of the model (a training step changes the weights) and its first test images on the device, with the
    device's roofs from `roofs_path` (the `roofs` stage's file) where given. All combinations share one device."""
    device = select_device(combinations[0].device, param="profile.devices")
    if config.threads:
        torch.set_num_threads(config.threads)
    checkpoint = load_checkpoint(checkpoint_path)
    summary = summarize(checkpoint.model, checkpoint.model.input_shape)  # on the CPU, before the move
    test_images, test_labels = load_split(data_root, "test")
    lr = float(checkpoint.train_params["lr"])
    kind = combinations[0].kind
    program_starts = min(config.program_starts, config.processes)
    settings = ProfileSettings(
        threads=torch.get_num_threads(),
        precision=PROFILE_PRECISION,
        memory_format=str(MEMORY_FORMAT).removeprefix("torch."),
        warmup_steps=config.warmup_steps,
        active_steps=config.active_steps,
        optimizer_lr=lr,
        ci_target_pct=config.ci_target_pct,
        time_budget_s=config.time_budget_s,
        allocator=plan_allocator().description,  # what the timing runs with: run_device_profile sets it up
        processes=config.processes,
        program_starts=program_starts,
        processes_at_once=processes_at_once(
            config.processes_at_once,
            kind.on_host,
            torch.get_num_threads(),
            config.energy and bool(kind.energy_source(device.index or 0)[0]),
            program_starts,
        ),
    )
    hardware = hardware_description(device)
    model_digest = checkpoint_digest(checkpoint_path)
    roofs = _device_roofs(roofs_path, combinations[0].device) if roofs_path else None
    setups = []
    for combination in combinations:
        if combination.batch_size > len(test_labels):
            raise PipelineError(
                f"`profile.batch_sizes` has {combination.batch_size}, more than the {len(test_labels)} test images "
                "a batch is drawn from; use a smaller batch size."
            )
        model = copy.deepcopy(checkpoint.model).to(device).to(memory_format=MEMORY_FORMAT)
        batch = combination.batch_size
        images = normalize_images(test_images[:batch], device).contiguous(memory_format=MEMORY_FORMAT)
        labels = torch.from_numpy(test_labels[:batch].astype("int64")).to(device)
        setups.append(
            ProfileSetup(
                combination=combination,
                device=device,
                step=build_step(model, combination.mode, images, labels, lr),
                hardware=hardware,
                settings=settings,
                data_digest=checkpoint.data_digest,
                flops_per_sample=float(
                    summary.forward_flops_per_sample
                    if combination.mode == "inference"
                    else summary.training_flops_per_sample
                ),
                model_digest=model_digest,
                graph_step=(
                    make_graphable_step(copy.deepcopy(model), combination.mode, images, labels, lr)
                    if kind_of(device).graph_capture()
                    else None
                ),
                roofs=roofs,
            )
        )
    return setups


def _device_roofs(path: Path, device: str) -> DeviceRoofs:
    roofs = read_roofs(path).for_device(device)
    if roofs is None:
        raise PipelineError(f"{path} has no roofs of device {device}; run `dvc repro roofs` on this machine.")
    return roofs


def allocator_whatif_spec(spec: WorkerSpec, seconds: float) -> WorkerSpec:
    """The timing spec with glibc malloc's defaults kept, as a fresh program has them: `seconds` of timing per
    combination, page faults counted after it; no memory or energy (the tuned processes measure those)."""
    items = tuple(item for item in spec.items if item[1] != GRADIENTS)  # the what-if is of the profiled steps
    return dataclasses.replace(
        spec,
        items=items,
        budget_s=seconds * len(items),
        tune_allocator=False,
        energy="",
        memory=False,
        page_faults=True,
    )


def trace_with_defaults(setup: ProfileSetup) -> tuple[OperatorStats, ...]:
    """The what-if's operator shares: one traced pass of the step with glibc malloc's defaults, which this process
    still runs. Before `tune_allocator`: once tuned, a process cannot go back to the defaults (mallopt turns glibc's
    dynamic threshold off for good). The what-if's times and page faults come from fresh processes
    (`allocator_whatif_spec`); this pass says where its time goes."""
    settings, step = setup.settings, setup.step.run
    sync = synchronizer(setup.device)
    for _ in range(settings.warmup_steps):
        step()
    sync()
    with tempfile.TemporaryDirectory(prefix="allocator-whatif-") as scratch:
        trace = Path(scratch) / "trace.json"
        trace_steps(step, sync, False, settings.active_steps, trace)
        return analyse_trace(read_trace(trace), setup.combination.device, ()).operators


@dataclass(frozen=True)
class DefaultAllocatorRun:
    allocator: str
    timing: StepTiming  # over the processes that kept glibc's defaults
    page_faults: tuple[float, ...]  # per step, each of those processes
    slowdown: PairedRatio  # defaults / tuned, pair by pair (statistics.ratio_over_pairs)
    operators: tuple[OperatorStats, ...]

    def whatif(self, tuned_page_faults_per_step: float, top_k: int) -> AllocatorWhatIf:
        estimate = self.timing.estimate
        return AllocatorWhatIf(
            default_allocator=self.allocator,
            step_time_ms_median=estimate.median_ms,
            step_time_ms_ci_low=estimate.ci_low_ms,
            step_time_ms_ci_high=estimate.ci_high_ms,
            page_faults_per_step=statistics.median(self.page_faults),
            tuned_page_faults_per_step=tuned_page_faults_per_step,
            operators=tuple(OperatorShare(row.operator, row.share_pct) for row in self.operators[: 2 * top_k]),
            slowdown=self.slowdown.value,
            slowdown_ci_low=self.slowdown.low,
            slowdown_ci_high=self.slowdown.high,
            process_slowdowns=tuple(float(f"{value:.5g}") for value in self.slowdown.process_values),
            process_page_faults=tuple(float(f"{value:.5g}") for value in self.page_faults),
        )


def default_allocator_runs(
    setups: Sequence[ProfileSetup], paired: PairedTiming, allocator: str
) -> list[DefaultAllocatorRun | None]:
    """Each combination's what-if from the processes that kept glibc's defaults (`paired.alternate`), its slowdown
    taken against the tuned process that ran next to each; None everywhere when none ran."""
    found = paired.alternate
    if found is None:
        return [None] * len(setups)
    return [
        DefaultAllocatorRun(
            allocator,
            found.timings[index],
            found.page_faults[index],
            ratio_over_pairs(found.timings[index].process_medians_ms, paired.timings[index].process_medians_ms),
            trace_with_defaults(setup),
        )
        for index, setup in enumerate(setups)
    ]


def timing_spec(setups: Sequence[ProfileSetup], config: ProfileConfig, checkpoint: Path, data_root: Path) -> WorkerSpec:
    """What every timing process measures: all of the device's combinations, interleaved, then the GRADIENTS items
    (pipeline.records.statistics.gradient_items); `time_budget_s` per item, so that each gets as many rounds as a
    combination (docs/timing.md: why), the processes sharing the sum."""
    combinations_ = tuple((setup.combination.batch_size, setup.combination.mode) for setup in setups)
    items = combinations_ + gradient_items(combinations_)
    return WorkerSpec(
        checkpoint=str(checkpoint.resolve()),
        data_root=str(data_root.resolve()),
        device=str(setups[0].device),
        items=items,
        threads=torch.get_num_threads(),
        warmup_steps=config.warmup_steps,
        ci_target_pct=config.ci_target_pct,
        budget_s=config.time_budget_s * len(items),
        # A counter counts the whole package or device: with processes side by side, each would count the others.
        energy=energy_source(setups[0])[0] if config.energy and setups[0].settings.processes_at_once == 1 else "",
    )


def energy_source(setup: ProfileSetup) -> tuple[str, str]:
    """The energy counter the timing processes of `setup`'s device read (pipeline.devices.counters.open_counter;
    "" for none) and, where there is none to read, why, in words for the report."""
    return setup.combination.kind.energy_source(setup.device.index or 0)


def no_energy_reason(setup: ProfileSetup, spec: WorkerSpec) -> str:
    """Why the timing processes of `spec` read no energy counter, in words for the report."""
    source, missing = energy_source(setup)
    at_once = setup.settings.processes_at_once
    if source and at_once > 1:
        return (
            f"not measured: {at_once} timing processes ran side by side (`profile.processes_at_once`), and the "
            "counter counts them all"
        )
    return missing or "not measured (`profile.energy: false`)"


def run_device_profile(
    setups: Sequence[ProfileSetup],
    spec: WorkerSpec,
    processes: int,
    top_k: int,
    trace_paths: Sequence[Path],
    allocator_whatif_s: float = 0.0,
    progress: Callable[[str], object] | None = None,
    server: WorkerServer | None = None,
    program_starts: int = 1,
    starting: Sequence[WorkerServer] = (),
) -> tuple[list[ProfileRecord], DeviceComparisons]:
    """Time every combination of one device paired, then trace each; the records keep the `top_k` most expensive
    operators and kernels.

    The combinations are first timed interleaved in `processes` fresh processes (pipeline.profiling.processes),
    forked in turn from `program_starts` servers: `server` where the stage started one early
    (`forked_worker_server`, before any tensor code), those in `starting` (started early, still importing), and new
    ones for the rest. Then, on a CPU, with
    `allocator_whatif_s` > 0 and glibc's allocator still at its defaults, as many more processes keep those defaults,
    each timed next to a tuned one (`allocator_whatif_spec`), and this process traces each step once with them
    (`trace_with_defaults`); then its allocator is tuned (pipeline.common.allocator) and everything else runs tuned,
    as in every other torch stage. `progress(what)` is called after each timing process (with its partner) and each
    traced combination."""
    on_process = (lambda index: progress(f"timing process {index}")) if progress else None
    kind = setups[0].combination.kind
    defaults = glibc_defaults() if kind.on_host and allocator_whatif_s > 0 else None
    alternate = allocator_whatif_spec(spec, allocator_whatif_s) if defaults else None
    paired = time_in_processes(
        spec,
        processes,
        on_process,
        server,
        servers=min(program_starts, processes),
        alternate=alternate,
        starting=starting,
        at_once=setups[0].settings.processes_at_once,
    )
    pause_at("timed")
    default_runs = default_allocator_runs(setups, paired, defaults.description if defaults else "")
    allocator = tune_allocator().description
    records = []
    power = kind.power_state(setups[0].device.index or 0)
    missing = "" if spec.energy else no_energy_reason(setups[0], spec)  # why the timing read no counter
    energies = [_energy(found, missing, power) for found in paired.energy]
    profiled = len(setups)  # the spec's GRADIENTS items come after the combinations: only their ratios are kept
    timings = paired.timings[:profiled]
    measured = zip(setups, timings, paired.memory, energies[:profiled], trace_paths, default_runs, strict=True)
    for setup, timing, memory, (energy, no_energy), path, default_run in measured:
        record = _profile_record(setup, timing, path, top_k, allocator, default_run, memory)
        records.append(dataclasses.replace(record, energy=energy, energy_unavailable=no_energy))
        if progress:
            progress(f"traced {setup.combination.name}")
    return records, device_comparisons(setups, paired)


def _energy(
    found: StepEnergy | str | None, missing: str, power: GpuPowerState | Unavailable | None
) -> tuple[StepEnergy | None, str]:
    """A combination's energy for its record, with the GPU's power limit and clocks; or why there is none
    (`missing`: why no counter was read at all)."""
    if found is None:
        return None, missing
    if isinstance(found, str):
        return None, found
    if isinstance(power, GpuPowerState):
        found = dataclasses.replace(
            found,
            power_limit_w=power.power_limit_w,
            sm_clock_mhz=power.sm_clock_mhz,
            memory_clock_mhz=power.memory_clock_mhz,
        )
    return found, ""


def _profile_record(
    setup: ProfileSetup,
    step_timing: StepTiming,
    trace_path: Path,
    top_k: int,
    allocator: str,
    default_run: DefaultAllocatorRun | None,
    memory: StepMemory,
) -> ProfileRecord:
    settings = dataclasses.replace(setup.settings, allocator=allocator)
    result = profile_combination(
        setup.combination,
        setup.step,
        setup.device,
        settings.warmup_steps,
        settings.active_steps,
        trace_path,
        ci_target_pct=settings.ci_target_pct,
        time_budget_s=settings.time_budget_s,
        step_timing=step_timing,
        memory=memory,
    )
    roofs = setup.roofs
    timing = result.timing()
    analysis = result.analysis
    graph_times: tuple[float, ...] = ()
    if setup.graph_step is not None:  # after the eager passes, so that graph memory pools stay out of them
        graph_times = time_graph_replays(setup.graph_step, settings.warmup_steps, settings.active_steps)
    return ProfileRecord(
        combination=setup.combination,
        hardware=setup.hardware,
        settings=settings,
        timing=timing,
        conditions=result.step_timing.conditions,
        block_times_ms=result.block_times_ms(),
        top_operators=result.operators[:top_k],
        data_digest=setup.data_digest,
        analysis=StepAnalysis(
            anatomy=analysis.anatomy,
            flop_rate=flop_rate(
                setup.flops_per_sample,
                setup.combination.batch_size,
                timing.step_time_ms_median,
                roofs.matmul_gflops_per_s.best if roofs else 0.0,
                bytes_per_step=result.bytes_per_step,
                bandwidth_gb_per_s=roofs.triad_gb_per_s.best if roofs else 0.0,
                update_bytes_per_step=result.update_bytes_per_step,
            ),
            peak_method=roofs.method if roofs else "",
            ranges=analysis.ranges,
            top_kernels=analysis.kernels[:top_k],
            unattributed_device_ms=analysis.unattributed_device_ms,
            parts=analysis.parts,
        ),
        graph_step_times_ms=graph_times,
        allocator_whatif=default_run.whatif(result.page_faults_per_step, top_k) if default_run else None,
        process_step_times_ms=tuple(float(f"{ms:.5g}") for ms in result.step_timing.process_medians_ms),
        trace_check=result.trace_check,
        memory=result.memory,
    )


def device_comparisons(setups: Sequence[ProfileSetup], paired: PairedTiming) -> DeviceComparisons:
    """Every ratio the report states, from the paired blocks: per sample between each two batch sizes of a mode
    (larger batch over smaller), per step between the two modes of a batch size (train over inference); and, where
    the GRADIENTS items were timed (`gradient_items`), the parts: training over the step without its update, and
    that over inference."""
    device = setups[0].combination.device
    profiled: list[tuple[int, str]] = [(setup.combination.batch_size, setup.combination.mode) for setup in setups]
    items = profiled + list(gradient_items(profiled))
    names = [f"{batch}-{device}-{mode}" for batch, mode in items]  # Combination.name, GRADIENTS ones too

    def blocks(item: int) -> list[tuple[Block, ...]]:
        return [process[item] for process in paired.process_blocks]

    comparisons: list[PairedComparison] = []
    parts: list[PairedComparison] = []
    for numerator, denominator, scale in comparison_pairs(items):
        found = paired_ratio(blocks(numerator), blocks(denominator), scale)
        per = "sample" if items[numerator][1] == items[denominator][1] else "step"
        comparison = _comparison(names[numerator], names[denominator], per, found)
        gradients = GRADIENTS in (items[numerator][1], items[denominator][1])
        (parts if gradients else comparisons).append(comparison)
    return DeviceComparisons(
        device=device,
        processes=len(paired.process_blocks),
        comparisons=tuple(comparisons),
        process_speeds=tuple(float(f"{speed:.5g}") for speed in paired.speeds),
        parts=tuple(parts),
    )


def _comparison(numerator: str, denominator: str, per: str, found: PairedRatio) -> PairedComparison:
    return PairedComparison(
        numerator=numerator,
        denominator=denominator,
        per=per,
        value=found.value,
        low=found.low,
        high=found.high,
        process_values=tuple(float(f"{value:.6g}") for value in found.process_values),
    )


def run_description(setup: ProfileSetup, top_k: int) -> RunDescription:
    """What the MLflow run of one combination records besides its results."""
    return RunDescription(
        params=run_params(setup.combination, setup.settings, top_k),
        tags={
            DATA_DIGEST_TAG: setup.data_digest,
            MODEL_DIGEST_TAG: setup.model_digest,
            "combination": setup.combination.name,
            # Tags, as on the train run: they say where it ran; MLflow's Compare lists params to compare.
            **hardware_tags(setup.hardware),
        },
        model_digest=setup.model_digest,
    )
