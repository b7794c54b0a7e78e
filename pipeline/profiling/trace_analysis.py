"""What a torch.profiler Chrome trace says about each traced step: operators, kernels, idle time.

Torch-free: it reads the trace file (`.json` or `.json.gz`) that `export_chrome_trace` wrote, so the
same code runs in the profile stage and in tests on traces from a GPU machine, without a GPU.

Why the trace and not `key_averages()`: on CUDA, `key_averages()` lists ATen operators,
`record_function` ranges (`Optimizer.step#Adadelta.step`, whose GPU time is the kernels launched
inside it) and raw kernels side by side, so the same kernel time is counted two or three times in the
total every share is taken of. The trace keeps each kind apart and links every kernel to the call
that launched it, so each microsecond is counted once:

- an *operator* is a `cpu_op` event named `namespace::op` (`aten::addmm`), not an autograd node
  (`AddmmBackward0`) and not a range (`ProfilerStep#3`, `Optimizer.step#…`, any `user_annotation`);
- its *self CPU time* is its duration minus the operators and ranges nested in it on its thread
  (the CUDA launch calls it makes stay in its own time: launching is part of its cost);
- its *self device time* is the kernels, copies and memsets whose launch (matched by correlation id)
  sits inside it and in no deeper operator (a kernel whose launch call was not recorded falls back to
  the operator its `External id` names);
- *GPU busy* is the union of those device intervals inside a `ProfilerStep#N` span; on the CPU the
  counterpart is the union of the operators' intervals (time the step spends inside ATen).

FLOPs are not in the trace: callers pass in the FLOPs of each counted call of one step, in call order
(`CountedCall`, from torch.utils.flop_counter). The k-th call of `aten::convolution` counted is the k-th
`aten::convolution` event of every traced step, and its FLOPs go to the operator that does the work: the
call itself, or the one operator below it that implements it (`aten::convolution` → `aten::_convolution`
→ `aten::mkldnn_convolution` / `aten::cudnn_convolution` / `aten::thnn_conv2d` → `aten::_slow_conv2d_forward`).
Wrappers above or along that chain (`aten::conv2d`, `aten::linear`, `aten::_convolution`) get none, so
every FLOP is counted once and the operators' FLOPs add up to the step's.

The allocator's events (`[memory]`, recorded with `profile_memory`) give each operator's *allocated MB*: the bytes
allocated on the combination's device while it was the innermost operator running on that thread, per step; an
allocation inside a tensor factory (`aten::empty`, `aten::empty_like`, ...) counts for the operator that called it,
whose output or scratch it is.
"""

from __future__ import annotations

import bisect
import dataclasses
import gzip
import json
import re
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from pipeline.common.errors import PipelineError
from pipeline.devices.registry import device_kind, device_kinds
from pipeline.records.quantities import (
    KernelStats,
    RangeStats,
    StepAnatomy,
    StepPart,
    anatomy_verdict,
)

STEP_PREFIX = "ProfilerStep#"
OPERATOR_NAME = re.compile(r"^(?!autograd::|torch::autograd::)[A-Za-z_]\w*::\w")
LAUNCH_CATEGORIES = frozenset({"cuda_runtime", "cuda_driver"})  # cuDNN/cuBLAS launch some kernels via the driver API
DEVICE_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
RANGE_CATEGORIES = frozenset({"user_annotation"})


@dataclass(frozen=True)
class TraceEvent:
    """One complete ('X') event; times in microseconds as the trace stores them."""

    name: str
    category: str
    start_us: float
    duration_us: float
    thread: str  # "pid/tid": CPU threads and GPU streams alike
    correlation: int | None  # links a launch call to the kernel it launched
    external_id: int | None = None  # links an operator to the kernels launched inside it (Kineto's "External id")

    @property
    def end_us(self) -> float:
        return self.start_us + self.duration_us


@dataclass(frozen=True)
class Allocation:
    """One allocation (`[memory]` event with a positive size) of the traced process."""

    time_us: float
    bytes: int
    thread: str  # "pid/tid", as TraceEvent.thread
    device: str  # the torch device type it was allocated on


# Operators that only allocate: their allocations belong to the operator that called them.
_TENSOR_FACTORIES = frozenset(
    {"aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty", "aten::new_empty_strided"}
)


@dataclass(frozen=True)
class Trace:
    steps: tuple[TraceEvent, ...]  # the ProfilerStep#N ranges, in time order
    host: tuple[TraceEvent, ...]  # operators, ranges and launch calls on CPU threads
    device: tuple[TraceEvent, ...]  # kernels, copies, memsets on GPU streams
    allocations: tuple[Allocation, ...] = ()  # none where the trace was recorded without profile_memory

    @property
    def step_count(self) -> int:
        return len(self.steps)

    def median_step_ms(self) -> float:
        """The median ProfilerStep span: the traced step's wall time."""
        return statistics.median(step.duration_us for step in self.steps) / 1000


@dataclass(frozen=True)
class OperatorStats:
    """One ATen operator, per traced step (the same fields as the profile record's operator rows)."""

    operator: str
    calls_per_step: float
    self_cpu_ms: float
    total_cpu_ms: float  # children included
    self_device_ms: float  # kernels it launched itself; 0 without a GPU
    total_device_ms: float  # kernels of it and the operators nested in it
    share_pct: float  # of the ranked total: self device time on a GPU, self CPU time on the CPU
    mflops: float | None  # per step, the work it runs itself; None: no counted FLOPs (no formula, or a wrapper)
    # Per step, megabytes its counted calls read and write (inputs, weights, outputs); None where mflops is None.
    mbytes: float | None = None
    allocated_mb: float = 0.0  # per step, MB (10^6 bytes) allocated on the device while it was the innermost operator


@dataclass(frozen=True)
class CountedCall:
    """One call of an operator with a FLOP formula in one step, as torch.utils.flop_counter counted it."""

    operator: str  # the name the trace gives it: `aten::convolution`, `aten::convolution_backward`, `aten::mm`
    flops: float
    bytes: float = 0.0  # its tensors' bytes: inputs (weights among them) and outputs, each counted once per use


# What implements a counted operator: an operator below it whose name says it does the same work. The chain is
# followed while exactly one child matches (a bias `aten::add_` or `aten::reshape` beside the kernel never does).
_IMPLEMENTATION_FAMILIES = (re.compile(r"conv"), re.compile(r"mm|gemm|matmul"), re.compile(r"attention"))


@dataclass(frozen=True)
class TraceAnalysis:
    operators: tuple[OperatorStats, ...]  # every operator, most expensive first
    ranges: tuple[RangeStats, ...]
    kernels: tuple[KernelStats, ...]  # empty without a GPU
    anatomy: StepAnatomy
    unattributed_device_ms: float  # device time per step launched outside any operator
    parts: tuple[StepPart, ...] = ()  # the step split by phase and layer group, per traced step


def read_trace(path: Path) -> Trace:
    """Parse a Chrome trace written by torch.profiler; only the events the analysis uses are kept."""
    try:
        with gzip.open(path, "rt") if path.name.endswith(".gz") else path.open() as handle:
            document = json.load(handle)
    except FileNotFoundError:
        raise PipelineError(f"trace `{path}` is missing: run the profile stage that writes it (`dvc repro`).") from None
    except (OSError, EOFError, json.JSONDecodeError, UnicodeDecodeError) as error:
        raise PipelineError(
            f"trace `{path}` is not a readable Chrome trace ({error}); delete it and re-run its profile stage."
        ) from None
    raw = document.get("traceEvents") if isinstance(document, dict) else None
    if not isinstance(raw, list):
        raise PipelineError(f"trace `{path}` has no `traceEvents` list; it is not a torch.profiler trace.")
    steps: list[TraceEvent] = []
    host: list[TraceEvent] = []
    device: list[TraceEvent] = []
    allocations: list[Allocation] = []
    for item in raw:
        if isinstance(item, dict) and item.get("name") == "[memory]":
            allocation = _allocation(item)
            if allocation is not None:
                allocations.append(allocation)
            continue
        if not isinstance(item, dict) or item.get("ph") != "X" or "dur" not in item:
            continue
        category = str(item.get("cat", ""))
        name = str(item.get("name", ""))
        args = item.get("args") or {}
        args = args if isinstance(args, dict) else {}
        correlation, external_id = args.get("correlation"), args.get("External id")
        event = TraceEvent(
            name=name,
            category=category,
            start_us=float(item["ts"]),
            duration_us=float(item["dur"]),
            thread=f"{item.get('pid')}/{item.get('tid')}",
            correlation=correlation if isinstance(correlation, int) else None,
            external_id=external_id if isinstance(external_id, int) else None,
        )
        if category in RANGE_CATEGORIES and name.startswith(STEP_PREFIX):
            steps.append(event)
        elif category in DEVICE_CATEGORIES:
            device.append(event)
        elif category == "cpu_op" or category in RANGE_CATEGORIES or category in LAUNCH_CATEGORIES:
            host.append(event)
    if not steps:
        raise PipelineError(
            f"trace `{path}` has no `{STEP_PREFIX}N` ranges: it was not recorded with a profiler schedule "
            "and `profiler.step()`, so steps cannot be told apart; re-run its profile stage."
        )
    steps.sort(key=lambda event: event.start_us)
    return Trace(steps=tuple(steps), host=tuple(host), device=tuple(device), allocations=tuple(allocations))


def _allocation(item: dict[str, object]) -> Allocation | None:
    """A `[memory]` event as an Allocation; None for a free or an event of another kind of device."""
    args = item.get("args")
    if not isinstance(args, dict):
        return None
    code = int(args.get("Device Type", -1))
    size = args.get("Bytes")
    device = next((kind.torch_type for kind in device_kinds().values() if kind.trace_device_type == code), None)
    if not isinstance(size, int) or size <= 0 or device is None or not isinstance(item.get("ts"), (int, float)):
        return None
    return Allocation(float(item["ts"]), size, f"{item.get('pid')}/{item.get('tid')}", device)  # type: ignore[arg-type]


def analyse_trace(trace: Trace, device: str, step_flops: Sequence[CountedCall] = ()) -> TraceAnalysis:
    """Per-step operator ranking, ranges, kernel table and step anatomy of one traced combination.

    `device` is the combination's device kind (one on the host ranks by self CPU time, any other by self device
    time); `step_flops` are the counted calls of one step, in call order (see the module's docstring).
    """
    steps = trace.step_count
    window = StepSpans(trace.steps)
    host = [event for event in trace.host if window.index(event.start_us) is not None]
    parents = nest_events(host)
    is_operator = [event.category == "cpu_op" and OPERATOR_NAME.match(event.name) is not None for event in host]
    owner = _launching_operators(host, parents, is_operator)  # launch index -> innermost operator index
    launches = {event.correlation: index for index, event in enumerate(host) if event.category in LAUNCH_CATEGORIES}
    operator_ids = {event.external_id: i for i, event in enumerate(host) if is_operator[i] and event.external_id}

    self_cpu = [event.duration_us for event in host]
    for index, parent in enumerate(parents):
        if parent is not None and host[index].category not in LAUNCH_CATEGORIES:
            self_cpu[parent] -= host[index].duration_us
    self_device = [0.0] * len(host)
    unattributed = 0.0
    kernels: dict[str, list[float]] = defaultdict(list)
    kernel_owners: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    device_events: list[TraceEvent] = []
    for event in trace.device:
        launch = launches.get(event.correlation) if event.correlation is not None else None
        named = operator_ids.get(event.external_id) if event.external_id is not None else None
        if launch is None and named is None and window.index(event.start_us) is None:
            continue  # neither launched nor run inside a traced step
        device_events.append(event)
        kernels[event.name].append(event.duration_us)
        operator = owner.get(launch) if launch is not None else named
        if operator is None:
            unattributed += event.duration_us
            kernel_owners[event.name]["(no operator)"] += event.duration_us
        else:
            self_device[operator] += event.duration_us
            kernel_owners[event.name][host[operator].name] += event.duration_us

    total_device = list(self_device)
    for index in sorted(range(len(host)), key=lambda i: _depth(parents, i), reverse=True):  # children first
        parent = parents[index]
        if parent is not None:
            total_device[parent] += total_device[index]

    kind = device_kind(device)
    on_gpu = not kind.on_host
    work, work_by_event = _attribute_flops(host, parents, is_operator, window, step_flops)
    allocated = _allocated_bytes(trace, host, parents, is_operator, window, kind.torch_type)
    operators = _rank_operators(host, is_operator, self_cpu, self_device, total_device, steps, on_gpu, work, allocated)
    ranges = _ranges(host, total_device, steps)
    kernel_rows = _kernel_rows(kernels, kernel_owners, steps)
    anatomy = _anatomy(trace, host, is_operator, device_events, window, on_gpu, device)
    parts = _step_parts(
        trace, host, parents, is_operator, self_device if on_gpu else self_cpu, work_by_event, window, not on_gpu
    )
    return TraceAnalysis(
        operators=operators,
        ranges=ranges,
        kernels=kernel_rows,
        anatomy=anatomy,
        unattributed_device_ms=unattributed / steps / 1000,
        parts=parts,
    )


class StepSpans:
    """Which ProfilerStep span a timestamp falls in."""

    def __init__(self, steps: Sequence[TraceEvent]) -> None:
        self.steps = steps
        self.starts = [step.start_us for step in steps]

    def index(self, time_us: float) -> int | None:
        position = bisect.bisect_right(self.starts, time_us) - 1
        if position < 0 or time_us >= self.steps[position].end_us:
            return None
        return position


def nest_events(events: Sequence[TraceEvent]) -> list[int | None]:
    """Parent index of each event: the innermost event on the same thread that encloses it."""
    parents: list[int | None] = [None] * len(events)
    by_thread: dict[str, list[int]] = defaultdict(list)
    for index, event in enumerate(events):
        by_thread[event.thread].append(index)
    for indices in by_thread.values():
        indices.sort(key=lambda i: (events[i].start_us, -events[i].duration_us))
        stack: list[int] = []
        for index in indices:
            while stack and events[stack[-1]].end_us <= events[index].start_us:
                stack.pop()
            parents[index] = stack[-1] if stack else None
            stack.append(index)
    return parents


def _allocated_bytes(
    trace: Trace,
    host: Sequence[TraceEvent],
    parents: Sequence[int | None],
    is_operator: Sequence[bool],
    window: StepSpans,
    device: str,
) -> dict[str, float]:
    """Operator name -> bytes allocated on `device` inside the traced steps while it was the innermost operator
    on the allocating thread. The innermost event around a moment is the last one to start before it, or one of
    that event's enclosing events (events on a thread nest)."""
    starts: dict[str, list[tuple[float, int]]] = defaultdict(list)
    for index, event in enumerate(host):
        starts[event.thread].append((event.start_us, index))
    for thread_starts in starts.values():
        thread_starts.sort()
    found: dict[str, float] = defaultdict(float)
    for allocation in trace.allocations:
        if allocation.device != device or window.index(allocation.time_us) is None:
            continue
        thread_starts = starts.get(allocation.thread, [])
        position = bisect.bisect_right(thread_starts, (allocation.time_us, len(host))) - 1
        candidate = thread_starts[position][1] if position >= 0 else None
        while candidate is not None and not (is_operator[candidate] and allocation.time_us <= host[candidate].end_us):
            candidate = parents[candidate]
        while candidate is not None and host[candidate].name in _TENSOR_FACTORIES:
            caller = parents[candidate]
            while caller is not None and not is_operator[caller]:
                caller = parents[caller]
            if caller is None:
                break
            candidate = caller
        if candidate is not None:
            found[host[candidate].name] += allocation.bytes
    return found


def _depth(parents: Sequence[int | None], index: int) -> int:
    depth, parent = 0, parents[index]
    while parent is not None:
        depth, parent = depth + 1, parents[parent]
    return depth


def _launching_operators(
    events: Sequence[TraceEvent], parents: Sequence[int | None], is_operator: Sequence[bool]
) -> dict[int, int]:
    """Launch-call index -> the innermost operator around it (absent when no operator encloses it)."""
    owners: dict[int, int] = {}
    for index, event in enumerate(events):
        if event.category not in LAUNCH_CATEGORIES:
            continue
        parent = parents[index]
        while parent is not None and not is_operator[parent]:
            parent = parents[parent]
        if parent is not None:
            owners[index] = parent
    return owners


def _attribute_flops(
    host: Sequence[TraceEvent],
    parents: Sequence[int | None],
    is_operator: Sequence[bool],
    window: StepSpans,
    step_flops: Sequence[CountedCall],
) -> tuple[dict[str, tuple[float, float]], dict[int, float]]:
    """FLOPs and bytes over all traced steps per operator name, each call's on the operator that implements it;
    and the FLOPs of each event that got a counted call (by its index in `host`).

    Calls are matched by order within each step (operators on all threads, by start time: on CUDA the
    backward runs on the autograd engine's own thread). Where a step's events of a counted operator do not
    match the counted calls one for one, that operator's work stays on its own row, so the total still holds.
    """
    counted: dict[str, list[CountedCall]] = defaultdict(list)
    for call in step_flops:
        counted[call.operator].append(call)
    children: dict[int, list[int]] = defaultdict(list)
    for index, parent in enumerate(parents):
        if parent is not None and is_operator[index]:
            children[parent].append(index)
    events: dict[tuple[str, int], list[int]] = defaultdict(list)
    for index, event in enumerate(host):
        step = window.index(event.start_us)
        if is_operator[index] and event.name in counted and step is not None:
            events[(event.name, step)].append(index)
    work: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])
    by_event: dict[int, float] = defaultdict(float)
    for step in range(len(window.steps)):
        for name, calls in counted.items():
            matched = sorted(events.get((name, step), []), key=lambda i: host[i].start_us)
            doers = [_implementation(index, host, children) for index in matched] if len(matched) == len(calls) else []
            owners = [host[index].name for index in doers] if doers else [name] * len(calls)
            for owner, call in zip(owners, calls, strict=True):
                work[owner][0] += call.flops
                work[owner][1] += call.bytes
            for index, call in zip(doers, calls, strict=False):
                by_event[index] += call.flops
    return {name: (flops, moved) for name, (flops, moved) in work.items()}, dict(by_event)


def _implementation(index: int, host: Sequence[TraceEvent], children: Mapping[int, Sequence[int]]) -> int:
    """The operator that does the work of the counted call `index`: follow the one child of the same family."""
    family = next((pattern for pattern in _IMPLEMENTATION_FAMILIES if pattern.search(host[index].name)), None)
    while family is not None:
        same = [child for child in children.get(index, ()) if family.search(host[child].name)]
        if len(same) != 1:
            break
        index = same[0]
    return index


def _rank_operators(
    host: Sequence[TraceEvent],
    is_operator: Sequence[bool],
    self_cpu: Sequence[float],
    self_device: Sequence[float],
    total_device: Sequence[float],
    steps: int,
    on_gpu: bool,
    work: Mapping[str, tuple[float, float]],
    allocated: Mapping[str, float],
) -> tuple[OperatorStats, ...]:
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0, 0.0])
    for index, event in enumerate(host):
        if not is_operator[index]:
            continue
        entry = sums[event.name]
        entry[0] += 1
        entry[1] += self_cpu[index]
        entry[2] += event.duration_us
        entry[3] += self_device[index]
        entry[4] += total_device[index]
    ranked_by = 3 if on_gpu else 1
    total = sum(entry[ranked_by] for entry in sums.values()) or 1.0
    rows = [
        OperatorStats(
            operator=name,
            calls_per_step=entry[0] / steps,
            self_cpu_ms=entry[1] / steps / 1000,
            total_cpu_ms=entry[2] / steps / 1000,
            self_device_ms=entry[3] / steps / 1000,
            total_device_ms=entry[4] / steps / 1000,
            share_pct=100.0 * entry[ranked_by] / total,
            mflops=work[name][0] / steps / 1e6 if name in work else None,
            mbytes=work[name][1] / steps / 1e6 if name in work else None,
            allocated_mb=allocated.get(name, 0.0) / steps / 1e6,
        )
        for name, entry in sums.items()
    ]
    rows.sort(key=lambda row: (row.share_pct, row.self_cpu_ms), reverse=True)
    return tuple(rows)


def _ranges(host: Sequence[TraceEvent], total_device: Sequence[float], steps: int) -> tuple[RangeStats, ...]:
    sums: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0])
    for index, event in enumerate(host):
        if event.category in RANGE_CATEGORIES:
            entry = sums[event.name]
            entry[0] += 1
            entry[1] += event.duration_us
            entry[2] += total_device[index]
    rows = [
        RangeStats(name=name, calls_per_step=e[0] / steps, cpu_ms=e[1] / steps / 1000, device_ms=e[2] / steps / 1000)
        for name, e in sums.items()
    ]
    return tuple(sorted(rows, key=lambda row: row.cpu_ms, reverse=True))


def _kernel_rows(
    kernels: Mapping[str, list[float]], owners: Mapping[str, Mapping[str, float]], steps: int
) -> tuple[KernelStats, ...]:
    total = sum(sum(durations) for durations in kernels.values()) or 1.0
    rows = []
    for name, durations in kernels.items():
        by_owner = sorted(owners[name].items(), key=lambda item: item[1], reverse=True)
        rows.append(
            KernelStats(
                kernel=short_kernel_name(name),
                launches_per_step=len(durations) / steps,
                device_ms=sum(durations) / steps / 1000,
                mean_us=statistics.fmean(durations),
                share_pct=100.0 * sum(durations) / total,
                launched_by=", ".join(owner for owner, _ in by_owner),
                full_name=name,
            )
        )
    return tuple(sorted(rows, key=lambda row: row.device_ms, reverse=True))


def _anatomy(
    trace: Trace,
    host: Sequence[TraceEvent],
    is_operator: Sequence[bool],
    device_events: Sequence[TraceEvent],
    window: StepSpans,
    on_gpu: bool,
    device: str,
) -> StepAnatomy:
    busy_sources = device_events if on_gpu else [event for index, event in enumerate(host) if is_operator[index]]
    busy_total = sum(_covered(step, busy_sources) for step in trace.steps)
    span_total = sum(step.duration_us for step in trace.steps) or 1.0
    steps = trace.step_count
    busy_pct = 100.0 * busy_total / span_total
    step_ms = trace.median_step_ms()
    launches = len(device_events) / steps if on_gpu else 0.0
    mean_launch = statistics.fmean(event.duration_us for event in device_events) if on_gpu and device_events else 0.0
    # Only calls that started device work: cudaDeviceSynchronize & co. are waiting, not launching.
    launched = {event.correlation for event in device_events}
    launch_calls = (
        sum(e.duration_us for e in host if e.category in LAUNCH_CATEGORIES and e.correlation in launched) / steps / 1000
    )
    verdict = anatomy_verdict(device, busy_pct)
    anatomy = StepAnatomy(
        device=device,
        traced_steps=steps,
        step_ms=step_ms,
        busy_ms=busy_total / steps / 1000,
        busy_pct=busy_pct,
        idle_pct=100.0 - busy_pct,
        launches_per_step=launches,
        mean_launch_us=mean_launch,
        launch_call_ms=launch_calls if on_gpu else 0.0,
        verdict=verdict,
        reason="",
        operator_calls_per_step=sum(is_operator) / steps,
    )
    return dataclasses.replace(anatomy, reason=anatomy.explained(not on_gpu))


# The layer group an operator serves, from the name of its outermost operator in the forward pass or of its autograd
# node in the backward pass; the first pattern that matches wins, and a name no pattern matches is "other".
_LAYER_GROUPS = (
    ("convolution", re.compile(r"conv", re.IGNORECASE)),
    ("linear", re.compile(r"(^|::)(addmm|mm|linear|matmul|t)$|^(Addmm|Mm|T|Linear)Backward")),
    ("loss", re.compile(r"log_softmax|nll_loss|LogSoftmax|NllLoss")),
    (
        "pool_activation_dropout",
        re.compile(
            r"pool|relu|threshold|clamp|dropout|bernoulli|uniform|(^|::)(where|ge|mul|empty_like)$|"
            r"^(MaxPool\w*|Relu|Threshold|Clamp\w*|Where|Mul|\w*Dropout)Backward"
        ),
    ),
)
# The update: the optimizer's step. Its zero_grad (no operator where it sets the gradients to None) belongs to the
# step without the update, as the training step's parts time it (pipeline.records.statistics.GRADIENTS).
_OPTIMIZER_RANGES = ("Optimizer.step",)
_AUTOGRAD_NODE = "autograd::engine::evaluate_function: "


def layer_group(name: str) -> str:
    """`aten::conv2d` and `ConvolutionBackward0` -> "convolution"; `aten::flatten` -> "other"."""
    return next((group for group, pattern in _LAYER_GROUPS if pattern.search(name)), "other")


def _step_parts(
    trace: Trace,
    host: Sequence[TraceEvent],
    parents: Sequence[int | None],
    is_operator: Sequence[bool],
    own_time: Sequence[float],
    flops: Mapping[int, float],
    window: StepSpans,
    on_host: bool,
) -> tuple[StepPart, ...]:
    """The traced steps split into phase x group (see measures.STEP_PHASES): each operator's own time (self CPU time
    on the CPU, its kernels' time on a GPU) goes to the part of its context; "outside" is the step's span less the
    operators' time in it, so the parts of a step add up to its span.

    On the host the optimizer's part is the span of its ranges (`Optimizer.step`, `Optimizer.zero_grad`): the Python
    between its operators (the loop over parameters, its hooks) is the update's own time, not time outside the
    operators of the step. On a GPU it stays its kernels' time, which a CPU range does not measure."""
    steps = trace.step_count
    times: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0] * steps)
    work: dict[tuple[str, str], float] = defaultdict(float)
    for index, event in enumerate(host):
        step = window.index(event.start_us)
        if not is_operator[index] or step is None:
            continue
        phase, group = operator_context(index, host, parents, is_operator)
        times[(phase, group)][step] += own_time[index]
        work[(phase, group)] += flops.get(index, 0.0)
    if on_host:
        spans_of_ranges = _optimizer_spans(host, parents, window, steps)
        if any(spans_of_ranges):
            optimizer = times[("optimizer", "optimizer")]
            for step in range(steps):
                optimizer[step] = max(optimizer[step], spans_of_ranges[step])
    inside = [sum(part[step] for part in times.values()) for step in range(steps)]
    parts = [
        StepPart(
            phase=phase,
            group=group,
            step_ms=tuple(round(value / 1000, 6) for value in values),
            mflops=work[(phase, group)] / steps / 1e6 if work.get((phase, group)) else None,
        )
        for (phase, group), values in sorted(times.items())
    ]
    spans = [step.duration_us for step in trace.steps]
    outside = tuple(round(max(0.0, span - used) / 1000, 6) for span, used in zip(spans, inside, strict=True))
    return (*parts, StepPart(phase="outside", group="outside", step_ms=outside))


def _optimizer_spans(
    host: Sequence[TraceEvent], parents: Sequence[int | None], window: StepSpans, steps: int
) -> list[float]:
    """Each step's time (us) inside the optimizer's outermost ranges."""
    spans = [0.0] * steps
    for index, event in enumerate(host):
        if not event.name.startswith(_OPTIMIZER_RANGES) or event.category not in RANGE_CATEGORIES:
            continue
        ancestor, nested = parents[index], False
        while ancestor is not None and not nested:
            nested = host[ancestor].name.startswith(_OPTIMIZER_RANGES)
            ancestor = parents[ancestor]
        step = window.index(event.start_us)
        if not nested and step is not None:
            spans[step] += event.duration_us
    return spans


def operator_context(
    index: int, host: Sequence[TraceEvent], parents: Sequence[int | None], is_operator: Sequence[bool]
) -> tuple[str, str]:
    """(phase, group) of operator `index`: inside an optimizer range -> optimizer; under an autograd node ->
    backward, grouped by the node; else forward, grouped by its outermost operator."""
    outermost, node, ancestor = host[index].name, None, parents[index]
    while ancestor is not None:
        name = host[ancestor].name
        if name.startswith(_OPTIMIZER_RANGES):
            return "optimizer", "optimizer"
        if name.startswith(_AUTOGRAD_NODE) and node is None:
            node = name.removeprefix(_AUTOGRAD_NODE)
        if is_operator[ancestor]:
            outermost = name
        ancestor = parents[ancestor]
    if node is not None:
        return "backward", layer_group(node)
    return "forward", layer_group(outermost)


def _covered(step: TraceEvent, events: Iterable[TraceEvent]) -> float:
    """Microseconds of `step` covered by at least one of `events` (overlaps counted once)."""
    intervals = sorted(
        (max(event.start_us, step.start_us), min(event.end_us, step.end_us))
        for event in events
        if event.end_us > step.start_us and event.start_us < step.end_us
    )
    covered, reach = 0.0, step.start_us
    for start, end in intervals:
        if end > reach:
            covered += end - max(start, reach)
            reach = end
    return covered


@dataclass(frozen=True)
class KernelKind:
    """A readable name for the kernels whose name matches `pattern`."""

    label: str
    pattern: re.Pattern[str]
    named_in_full: bool = False  # a copy or memset: its trace name is already readable (`Memcpy HtoD`)
    operation_hint: bool = True  # add the operation the kernel applies, where its name says one


def _kind(label: str, pattern: str, **how: bool) -> KernelKind:
    return KernelKind(label, re.compile(pattern, re.IGNORECASE), **how)


# The kernels this kind of model runs; the first matching kind wins.
KERNEL_KINDS = (
    _kind("memory copy", r"^Memcpy", named_in_full=True),
    _kind("memset", r"^Memset", named_in_full=True),
    _kind("optimizer multi-tensor update", r"multi_tensor_apply_kernel"),
    _kind("cuDNN workspace initialisation", r"init_device_workspace"),  # before the kernel it serves: wgrad, ...
    _kind("cuDNN split-K reduction", r"ReduceSplitK"),
    _kind("cuDNN layout conversion", r"nchwToNhwc|nhwcToNchw|convertTensor_kernel", operation_hint=False),
    _kind("cuDNN convolution weight gradient", r"wgrad"),
    _kind("cuDNN convolution input gradient", r"dgrad"),
    _kind("cuDNN convolution", r"fprop|implicit_gemm|implicit_convolve|convolve_|conv2d|winograd"),
    _kind("cuBLAS split-K reduction", r"splitKreduce"),
    _kind("cuBLASLt epilogue", r"cublasLt::epilogue", operation_hint=False),  # the bias added after a split GEMM
    _kind("cuBLAS dot product", r"dot_kernel<.*cublas", operation_hint=False),
    _kind("cuBLAS scale", r"\bscal_kernel<", operation_hint=False),
    _kind("cuBLAS reduction", r"reduce_\w*kernel<.*cublas", operation_hint=False),
    _kind("cuBLAS GEMV (matrix-vector)", r"gemv\w*::kernel|gemv_kernel|\bgemv\w*<", operation_hint=False),
    _kind("cuBLAS GEMM", r"xmma_gemm|gemm|gemv|cublas|cutlass", operation_hint=False),
    _kind("max pooling forward", r"max_pool\w*forward|maxpool\w*fwd", operation_hint=False),
    _kind("max pooling backward", r"max_pool\w*backward|maxpool\w*bwd", operation_hint=False),
    _kind("pooling", r"pool"),
    _kind("softmax", r"log_softmax|softmax", operation_hint=False),
    _kind("NLL loss", r"nll_loss"),
    _kind("dropout", r"fused_dropout|dropout|bernoulli"),
    _kind("random numbers", r"uniform_kernel|normal_kernel|random_kernel", operation_hint=False),
    _kind("reduction", r"reduce_kernel"),
    _kind("fill", r"fill"),
    _kind("elementwise", r"elementwise_kernel|elementwise"),
    _kind("indexing", r"index|scatter|gather"),
)
_ARCH = re.compile(r"\b(sm\d{2,3})_")
_HINTS = re.compile(
    r"CUDAFunctor_(\w+?)\b|launch_(\w+?)_kernel|launch_(\w+?)_scalar|std::(plus|minus|multiplies|divides)\b|"
    r"binary_internal::(\w+?)Functor\b|(compare)_scalar_kernel|"
    r"at::native::(Sqrt|Abs|Exp|Log|Reciprocal)<|(sum|mean|max|min|norm|argmax)_functor|(threshold|clamp|where|relu)"
)


def short_kernel_name(full_name: str) -> str:
    """A name a student can read: what the kernel does, its library or arch, the operation it applies.

    `sm90_xmma_fprop_implicit_gemm_f32f32_tf32f32_…_cudnn` -> "cuDNN convolution (sm90, TF32)";
    `void at::native::…::multi_tensor_apply_kernel<…Sqrt…>` -> "optimizer multi-tensor update (sqrt)".
    """
    kind = next((kind for kind in KERNEL_KINDS if kind.pattern.search(full_name)), None)
    if kind is None:
        return _function_name(full_name)
    if kind.named_in_full:
        return full_name
    details = []
    arch = _ARCH.search(full_name)
    if arch:
        details.append(arch.group(1))
    if "tf32" in full_name.lower():
        details.append("TF32")
    hint = _HINTS.search(full_name)
    if hint and kind.operation_hint:
        details.append(next(group for group in hint.groups() if group).lower())
    return f"{kind.label} ({', '.join(details)})" if details else kind.label


def _function_name(full_name: str) -> str:
    """`void ns::(anonymous namespace)::foo<T>(args)` -> `foo`; a plain name is cut to 60 characters."""
    name = full_name.removeprefix("void ").replace("(anonymous namespace)::", "")
    cut = min((position for position in (name.find("<"), name.find("(")) if position > 0), default=len(name))
    name = name[:cut].rsplit("::", 1)[-1]
    return name if len(name) <= 60 else name[:59] + "…"
