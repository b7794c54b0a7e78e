"""What a step holds at its peak (pipeline.profiling.memory): the lab model's real steps on the CPU, their parts
against the model's arithmetic and against the allocator's own running total, and the growth with the batch."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch

from pipeline.model.network import LabNet
from pipeline.params.schema import ProfileMode
from pipeline.profiling.memory import (
    Allocation,
    BuiltStep,
    HeldTensors,
    StepAllocations,
    allocated_size,
    breakdown,
    held_tensors,
    measure_step_memory,
    profile_one_step,
    read_step_allocations,
)
from pipeline.profiling.run import count_update_bytes
from pipeline.profiling.timing import synchronizer
from pipeline.profiling.worker import build_step
from pipeline.records.quantities import MEMORY_PARTS, StepMemory
from tests.helpers.data import LAB_MODEL

CPU = torch.device("cpu")
FLOAT, LABEL = 4, 8  # bytes of an fp32 value and of an int64 label
# The lab model's parameters from its layer sizes alone (params of LAB_MODEL; 28x28 input, two 3x3 convolutions,
# a 2x2 max-pool): conv1, conv2, fc1, fc2, each weights + biases.
CONV2_SIDE = 28 - 2 - 2
POOLED = LAB_MODEL.conv2_channels * (CONV2_SIDE // 2) ** 2
PARAMETERS = (
    (1 * LAB_MODEL.conv1_channels * 9 + LAB_MODEL.conv1_channels)
    + (LAB_MODEL.conv1_channels * LAB_MODEL.conv2_channels * 9 + LAB_MODEL.conv2_channels)
    + (POOLED * LAB_MODEL.hidden_units + LAB_MODEL.hidden_units)
    + (LAB_MODEL.hidden_units * 10 + 10)
)
WEIGHT_BYTES = PARAMETERS * FLOAT
# Adadelta's state: two running averages per parameter, and a step count (a 0-d fp32 tensor) per parameter tensor.
OPTIMIZER_STATE_BYTES = 2 * WEIGHT_BYTES + 8 * FLOAT  # 8 tensors: each layer's weight and bias
# What no part claims (the loss, max-pool's indices, kernels' scratch) stays under this share of the peak: every
# other byte alive at the peak is a tensor the model, the batch, autograd or the optimizer holds.
OTHER_AT_MOST = 0.05


def lab_step(batch: int, mode: ProfileMode) -> BuiltStep:
    """The profile stage's step on the lab model (channels-last), warmed up."""
    torch.manual_seed(0)
    model = LabNet(LAB_MODEL).to(memory_format=torch.channels_last)
    images = torch.randn(batch, 1, 28, 28).contiguous(memory_format=torch.channels_last)
    step = build_step(model, mode, images, torch.randint(0, 10, (batch,)), lr=1.0)
    for _ in range(3):
        step.run()
    return step


@pytest.fixture(scope="module")
def measured() -> dict[tuple[int, str], StepMemory]:
    return {
        (batch, mode): measure_step_memory(lab_step(batch, mode), CPU, synchronizer(CPU))
        for batch in (1, 16, 64)
        for mode in ("inference", "train")
    }


@pytest.mark.parametrize("batch", [1, 16, 64])
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_the_state_parts_are_the_models_arithmetic_exactly(
    measured: dict[tuple[int, str], StepMemory], batch: int, mode: str
) -> None:
    memory = measured[batch, mode]
    train = mode == "train"
    assert memory.bytes_of["weights"] == WEIGHT_BYTES == 4_799_528
    assert memory.bytes_of["optimizer state"] == (OPTIMIZER_STATE_BYTES if train else 0)
    assert memory.step_gradient_bytes == (WEIGHT_BYTES if train else 0)  # every parameter's gradient, once
    assert memory.bytes_of["gradients"] <= WEIGHT_BYTES  # those alive at the peak
    assert memory.bytes_of["inputs"] == batch * 28 * 28 * FLOAT + (batch * LABEL if train else 0)
    assert memory.start_bytes == (
        memory.bytes_of["weights"]
        + memory.bytes_of["optimizer state"]
        + memory.bytes_of["inputs"]
        + (WEIGHT_BYTES if train else 0)
    )  # what the step starts from: its state and the last step's gradients
    assert [part.name for part in memory.parts] == list(MEMORY_PARTS)
    assert sum(part.bytes for part in memory.parts) == memory.peak_bytes
    assert memory.bytes_of["other"] <= OTHER_AT_MOST * memory.peak_bytes
    assert memory.peak_above_start_bytes > 0
    assert memory.resident_bytes > memory.peak_bytes and "resident set" in memory.resident_of


@pytest.mark.parametrize("mode", ["inference", "train"])
def test_the_parts_add_up_to_the_allocators_own_running_total(mode: ProfileMode) -> None:
    """The breakdown's peak (sizes of every allocation and free, summed) is the peak of the `Total Allocated` the
    allocator itself reports with each event, above where it stood when the step began."""
    step = lab_step(16, mode)
    with tempfile.TemporaryDirectory() as scratch:
        profile_one_step(step.run, synchronizer(CPU), Path(scratch))
        held = held_tensors(step)
        trace = profile_one_step(step.run, synchronizer(CPU), Path(scratch))
    events = sorted(
        (e for e in trace["traceEvents"] if e.get("name") == "[memory]" and e["args"]["Device Type"] == 0),
        key=lambda e: e["args"]["Ev Idx"],
    )
    before = events[0]["args"]["Total Allocated"] - events[0]["args"]["Bytes"]
    reported = max(e["args"]["Total Allocated"] for e in events) - before
    gradients = {p.grad.untyped_storage().data_ptr() for p in step.model.parameters() if p.grad is not None}
    peak_above_start, parts = breakdown(read_step_allocations(trace, "cpu"), held, gradients, set())
    assert peak_above_start == reported > 0
    assert sum(parts.values()) == sum(held.all().values()) + peak_above_start


def test_memory_rises_with_the_batch_as_activations_predict(measured: dict[tuple[int, str], StepMemory]) -> None:
    for mode in ("inference", "train"):
        peaks = [measured[batch, mode].peak_bytes for batch in (1, 16, 64)]
        assert peaks == sorted(peaks) and len(set(peaks)) == 3, (mode, peaks)
    # Inference peaks in conv2's ReLU: its input and its output, each 64 channels of 24x24 per image, alive
    # together. Per image that is the same at every batch size (batch 1 peaks elsewhere, with less).
    per_image = 2 * LAB_MODEL.conv2_channels * CONV2_SIDE**2 * FLOAT
    for batch in (16, 64):
        assert measured[batch, "inference"].bytes_of["activations"] == batch * per_image
    # Training keeps activations for the backward pass and makes their gradients: both grow with the batch,
    # while the state (weights, optimizer state) stays.
    grown = [measured[batch, "train"] for batch in (1, 16, 64)]
    batch_parts = [m.bytes_of["activations"] + m.bytes_of["activation gradients"] for m in grown]
    assert batch_parts[-1] > batch_parts[0] and batch_parts[-1] >= 64 * per_image / 2
    assert {m.bytes_of["weights"] + m.bytes_of["optimizer state"] for m in grown} == {
        WEIGHT_BYTES + OPTIMIZER_STATE_BYTES
    }


def test_a_gradient_is_the_last_allocation_at_its_address_not_an_activation_that_held_it_before() -> None:
    """An allocator that reuses freed blocks gives a gradient the address an activation had earlier in the step:
    at the peak that address holds the activation, and the gradient (allocated after the peak) is not yet alive."""
    activation, scratch, gradient = 0x1000, 0x2000, 0x1000
    events = (
        Allocation(activation, 1024, 1.0, 1),  # forward: an activation
        Allocation(scratch, 512, 2.0, 1),  # the peak: 1,536 bytes
        Allocation(activation, -1024, 3.0, 1),  # backward frees the activation
        Allocation(gradient, 1024, 4.0, 1),  # and the gradient gets its block
    )
    held = HeldTensors(weights={}, optimizer_state={}, inputs={}, gradients={})
    peak, parts = breakdown(StepAllocations(events, {}, {}), held, {gradient}, {(activation, 1024)})
    assert peak == 1536
    assert (parts["activations"], parts["other"], parts["gradients"]) == (1024, 512, 0)
    # The same step with the gradient alive at a later, higher peak: the gradient's own allocation counts.
    later = (*events, Allocation(0x3000, 2048, 5.0, 1))
    peak, parts = breakdown(StepAllocations(later, {}, {}), held, {gradient}, {(activation, 1024)})
    assert (peak, parts["gradients"], parts["activations"], parts["other"]) == (3584, 1024, 0, 2560)


def test_cuda_events_are_read_for_the_cuda_device_in_the_caching_allocators_blocks() -> None:
    """No GPU here: the CUDA reading is checked on a CPU trace's events relabelled as the CUDA allocator writes
    them (`Device Type` 1, sizes in 512-byte blocks); the CPU's events then count for the CUDA device only."""
    step = lab_step(16, "inference")
    with tempfile.TemporaryDirectory() as scratch:
        trace = profile_one_step(step.run, synchronizer(CPU), Path(scratch))
    relabelled = json.loads(json.dumps(trace))
    for event in relabelled["traceEvents"]:
        if event.get("name") == "[memory]":
            size = event["args"]["Bytes"]
            event["args"]["Device Type"] = 1
            event["args"]["Bytes"] = (1 if size > 0 else -1) * allocated_size(abs(size), "cuda")
    cuda = read_step_allocations(relabelled, "cuda")
    assert read_step_allocations(relabelled, "cpu").events == ()
    assert cuda.events and all(abs(event.bytes) % 512 == 0 for event in cuda.events)
    assert (allocated_size(1, "cuda"), allocated_size(512, "cuda"), allocated_size(513, "cuda")) == (512, 512, 1024)
    assert allocated_size(513, "cpu") == 513


def test_the_updates_counted_bytes_are_its_own_a_few_passes_over_the_weights_and_the_same_at_any_batch() -> None:
    """Adadelta reads and writes the weights, their gradients and its two running averages, each about the weights'
    size, in several element-wise passes: between 4 and 40 times the weights' bytes, whatever the batch."""
    counted = [count_update_bytes(lab_step(batch, "train")) for batch in (1, 4)]
    assert 4 * WEIGHT_BYTES <= counted[0] <= 40 * WEIGHT_BYTES, counted
    assert counted[0] == counted[1]
