"""What one step holds in the device's memory at its peak, measured from the allocator's own events and sorted into
parts (weights, gradients, optimizer state, inputs, activations, activation gradients, optimizer temporaries, other).

torch's allocators (CPU and CUDA alike) report every allocation and free, with its address and size, to the
profiler when it runs with `profile_memory`. One step's events give its peak: the running sum of their sizes, at
its highest. What is alive at that moment is sorted by address: the model's parameters, the optimizer's state and
the batch are tensors the step starts from (their bytes are the tensors' own, the model's arithmetic); the
parameters' gradients are the tensors the step leaves in `.grad`; activations are the outputs of the model's
layers and the tensors autograd saves for the backward pass, noted by hooks while the step runs; an allocation
made inside the autograd engine's backward functions or the optimizer's step is an activation gradient or an
optimizer temporary; the rest is "other".

Two steps are profiled and the second is measured: torch's CPU allocator reports no free of a block allocated
before profiling started, so the first step registers the blocks (the gradients among them) that the second frees.

The autograd profiler (`torch.autograd.profiler.profile`) records the events rather than `torch.profiler.profile`,
whose start imports torch._inductor: seconds in every fresh timing process, for nothing this needs.
"""

from __future__ import annotations

import bisect
import json
import tempfile
from collections import defaultdict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pipeline.common.native_stderr import filtered_native_stderr
from pipeline.devices.registry import kind_of
from pipeline.records.quantities import MEMORY_PARTS, MemoryPart, StepMemory

# Ranges torch's profiler opens around the backward pass's functions and the optimizer's step.
BACKWARD_RANGE = "autograd::engine::evaluate_function"
OPTIMIZER_RANGE = "Optimizer.step#"
_RANGES = {"backward": BACKWARD_RANGE, "optimizer": OPTIMIZER_RANGE}


@dataclass(frozen=True)
class BuiltStep:
    """A step a profile times, with the tensors it holds between steps (what its memory starts from)."""

    run: Callable[[], None]
    model: nn.Module
    inputs: tuple[torch.Tensor, ...]  # the batch: images, labels
    optimizer: torch.optim.Optimizer | None  # train mode only


@dataclass(frozen=True)
class Allocation:
    """One allocator event of a trace: a positive size allocates, a negative one frees."""

    address: int
    bytes: int
    time_us: float
    thread: int


@dataclass(frozen=True)
class StepAllocations:
    """One profiled step's allocator events on one device and the ranges they may lie in."""

    events: tuple[Allocation, ...]  # in the allocator's order
    backward: dict[int, list[tuple[float, float]]]  # thread -> (start, end) of the backward functions, by start
    optimizer: dict[int, list[tuple[float, float]]]  # thread -> (start, end) of the optimizer's steps


def read_step_allocations(trace: dict[str, Any], device: str) -> StepAllocations:
    """The memory events of `device` in a Chrome trace's JSON, and the backward and optimizer ranges."""
    device_type = kind_of(device).trace_device_type
    memory = [
        event
        for event in trace["traceEvents"]
        if event.get("name") == "[memory]" and event.get("args", {}).get("Device Type") == device_type
    ]
    memory.sort(key=lambda event: (event["args"].get("Ev Idx", 0), event["ts"]))
    ranges: dict[str, dict[int, list[tuple[float, float]]]] = {kind: defaultdict(list) for kind in _RANGES}
    for event in trace["traceEvents"]:
        if event.get("ph") != "X":
            continue
        name = str(event.get("name", ""))
        kind = next((kind for kind, prefix in _RANGES.items() if name.startswith(prefix)), None)
        if kind:
            start = float(event["ts"])
            ranges[kind][int(event["tid"])].append((start, start + float(event["dur"])))
    for by_thread in ranges.values():
        for spans in by_thread.values():
            spans.sort()
    return StepAllocations(
        events=tuple(
            Allocation(int(e["args"]["Addr"]), int(e["args"]["Bytes"]), float(e["ts"]), int(e["tid"])) for e in memory
        ),
        backward=dict(ranges["backward"]),
        optimizer=dict(ranges["optimizer"]),
    )


def _inside(spans: dict[int, list[tuple[float, float]]], allocation: Allocation) -> bool:
    """Whether the allocation happened inside one of `spans` on its own thread (spans of one kind do not nest)."""
    on_thread = spans.get(allocation.thread, [])
    position = bisect.bisect_right(on_thread, (allocation.time_us, float("inf"))) - 1
    return position >= 0 and on_thread[position][0] <= allocation.time_us <= on_thread[position][1]


@dataclass(frozen=True)
class HeldTensors:
    """What the step starts from, by storage address -> bytes: each part's tensors."""

    weights: dict[int, int]
    optimizer_state: dict[int, int]
    inputs: dict[int, int]
    gradients: dict[int, int]  # the last step's, which the step frees or keeps

    def all(self) -> dict[int, int]:
        return {**self.weights, **self.optimizer_state, **self.inputs, **self.gradients}


def allocated_size(nbytes: int, device: str) -> int:
    """The bytes the allocator of torch device type `device` counts for a tensor of `nbytes`."""
    return kind_of(device).allocated_size(nbytes)


def _storages(tensors: Sequence[torch.Tensor]) -> dict[int, int]:
    return {
        t.untyped_storage().data_ptr(): allocated_size(t.untyped_storage().nbytes(), t.device.type) for t in tensors
    }


def held_tensors(step: BuiltStep) -> HeldTensors:
    """The step's state on its device (Adadelta keeps its step counts on the CPU when the weights are on a GPU)."""
    parameters = list(step.model.parameters())
    device = parameters[0].device
    state = [] if step.optimizer is None else list(step.optimizer.state.values())
    kept = [t for s in state for t in s.values() if isinstance(t, torch.Tensor) and t.numel() and t.device == device]
    return HeldTensors(
        weights=_storages(parameters),
        optimizer_state=_storages(kept),
        inputs=_storages(step.inputs),
        gradients=_storages([p.grad for p in parameters if p.grad is not None]),
    )


def breakdown(
    allocations: StepAllocations, held: HeldTensors, gradients: set[int], activations: set[tuple[int, int]]
) -> tuple[int, dict[str, int]]:
    """The step's peak above what it started from, and what is alive at that peak by part (bytes).

    `gradients`: storage addresses of the gradients the step leaves; `activations`: (address, bytes) of layer
    outputs and tensors saved for backward during the step."""
    running = peak = 0
    peak_index = -1
    for index, event in enumerate(allocations.events):
        running += event.bytes
        if running > peak:
            peak, peak_index = running, index
    # A gradient is the last allocation at its address: an allocator that reuses freed blocks (CUDA's caching
    # allocator, malloc) may have given the same address to an activation earlier in the step.
    gradient_allocation = {
        event.address: index
        for index, event in enumerate(allocations.events)
        if event.bytes > 0 and event.address in gradients
    }
    live: dict[int, tuple[int, Allocation]] = {}
    freed_held: set[int] = set()
    for index, event in enumerate(allocations.events[: peak_index + 1]):
        if event.bytes > 0:
            live[event.address] = (index, event)
        elif live.pop(event.address, None) is None:
            freed_held.add(event.address)
    parts = dict.fromkeys(MEMORY_PARTS, 0)
    for name, tensors in (
        ("weights", held.weights),
        ("optimizer state", held.optimizer_state),
        ("inputs", held.inputs),
        ("gradients", held.gradients),
    ):
        parts[name] += sum(size for address, size in tensors.items() if address not in freed_held)
    for address, (index, event) in live.items():
        if gradient_allocation.get(address) == index:
            part = "gradients"
        elif _inside(allocations.optimizer, event):
            part = "optimizer temporaries"
        elif _inside(allocations.backward, event):
            part = "activation gradients"
        elif (address, event.bytes) in activations:  # the size too: an address is reused within a step
            part = "activations"
        else:
            part = "other"
        parts[part] += event.bytes
    return peak, parts


@contextmanager
def _noting_activations(model: nn.Module) -> Iterator[set[tuple[int, int]]]:
    """Storage addresses of every leaf module's output and every tensor autograd saves, while inside."""
    noted: set[tuple[int, int]] = set()

    def note(tensor: object) -> None:
        if isinstance(tensor, torch.Tensor):
            storage = tensor.untyped_storage()
            noted.add((storage.data_ptr(), allocated_size(storage.nbytes(), tensor.device.type)))

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        note(tensor)
        return tensor

    leaves = [module for module in model.modules() if not any(True for _ in module.children())]
    hooks = [module.register_forward_hook(lambda _m, _i, output: note(output)) for module in leaves]
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            yield noted
    finally:
        for hook in hooks:
            hook.remove()


def profile_one_step(run: Callable[[], None], sync: Callable[[], None], scratch: Path) -> dict[str, Any]:
    """One step under the autograd profiler with memory events; its Chrome trace as JSON."""
    with filtered_native_stderr(), torch.autograd.profiler.profile(use_kineto=True, profile_memory=True) as profiler:
        run()
        sync()
    path = scratch / "memory-trace.json"
    profiler.export_chrome_trace(str(path))
    trace: dict[str, Any] = json.loads(path.read_text())
    return trace


def measure_step_memory(step: BuiltStep, device: torch.device, sync: Callable[[], None]) -> StepMemory:
    """Profile two steps and sort what the second holds at its peak into parts (the module's docstring says how)."""
    with tempfile.TemporaryDirectory(prefix="step-memory-") as scratch:
        profile_one_step(step.run, sync, Path(scratch))
        held = held_tensors(step)
        kind = kind_of(device)
        allocated_before = kind.reset_peak_memory(device)  # the allocator's own statistics, beside its events
        with _noting_activations(step.model) as activations:
            trace = profile_one_step(step.run, sync, Path(scratch))
        peak_after = kind.peak_memory(device)
        allocator_peak = None if allocated_before is None or peak_after is None else peak_after - allocated_before
    gradients = set(_storages([p.grad for p in step.model.parameters() if p.grad is not None]))
    allocations = read_step_allocations(trace, device.type)
    _, parts = breakdown(allocations, held, gradients, activations)
    # The gradients the step made: its allocations at the addresses its gradients lie at.
    made = {
        event.address: event.bytes for event in allocations.events if event.address in gradients and event.bytes > 0
    }
    start = sum(held.all().values())
    size, of = kind_of(device).resident(device)
    peak = sum(parts.values())  # what is alive at the peak: the start plus the most the step's events added
    return StepMemory(
        peak_bytes=peak,
        start_bytes=start,
        parts=tuple(MemoryPart(name, parts[name]) for name in MEMORY_PARTS),
        step_gradient_bytes=sum(made.values()),
        resident_bytes=size,
        resident_of=of,
        peak_low_bytes=peak,
        peak_high_bytes=peak,
        allocator_peak_above_start_bytes=allocator_peak,
    )
