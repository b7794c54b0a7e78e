"""What differs between device kinds, in one class: each kind (pipeline/devices/<kind>.py) is one instance of it or
of a subclass that overrides what its device does differently.

The attributes are torch-free, so the torch-free stages (validate, report) and the report's figures and wording
read them without importing torch. The methods that touch a device import torch inside themselves: only the torch
stages call them (training, roofs, profile).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Literal

if TYPE_CHECKING:
    import torch

    from pipeline.devices.counters import GpuPowerState, Unavailable

Support = Literal["tested", "untested"]


@dataclass(frozen=True)
class DeviceKind:
    """One kind of device a stage can train or profile on, as params.yaml names it."""

    name: str  # in params.yaml (`train.device`, `profile.devices`), stage names (`profile@<name>`) and folders
    torch_type: str  # the torch.device type its tensors live on
    label: str  # the short name of what computes, in tables and sentences: "CPU", "GPU"
    colour: str  # its colour in every figure (a matplotlib colour)
    where: str  # where a user finds one: "on <where>" ("a machine with an NVIDIA GPU and driver")
    # Operators run on the host's cores: there is no device-side time, no kernels or launches, and the host's
    # allocator, threads and RAPL package energy are the device's own.
    on_host: bool
    support: Support  # tested: this project's tests and a real run cover it; untested: defined, never run here
    auto_rank: int | None  # `train.device: auto` picks the available kind of the lowest rank; None: never picked
    # The `Device Type` of its memory events in a torch.profiler trace (c10::DeviceType).
    trace_device_type: int
    allocator_block_bytes: int  # its allocator counts each allocation in blocks of this many bytes (1: as asked)
    # Roof probes (pipeline.profiling.peak): an n x n fp32 product big enough to keep every core or SM busy, and
    # triad arrays far beyond any cache, small enough for a product to take well under a second.
    matrix_size: int
    triad_elements: int
    time_ranked_by: str  # what the operator table ranks by, in words
    # Its name in the hand-in, by language (pipeline/report/messages/<language>.toml); `label` in any other.
    names: Mapping[str, str] = field(default_factory=dict, compare=False)

    # -- on the machine, torch-free: what the validate stage checks --------------------------------------------

    def missing(self) -> str | None:
        """Why this machine has no such device (a clause after "but "), read without torch; None: it may have one."""
        return None

    # -- through torch: what the torch stages ask ------------------------------------------------------------

    def unusable(self, param: str) -> str | None:
        """Why torch cannot use this kind here, as a message naming `param` and the fix; None: usable."""
        return None

    def torch_device(self, index: int | None = None) -> torch.device:
        import torch

        return torch.device(self.torch_type) if index is None else torch.device(self.torch_type, index)

    def synchronize(self, device: torch.device) -> None:
        """Wait for the work queued on `device` (nothing to wait for on the host)."""

    def native_bf16(self, device: torch.device) -> bool:
        """Whether `device` computes bf16 natively (else mixed precision is emulated and slower than fp32)."""
        return False

    def fills_uninitialized_memory(self) -> bool:
        """Whether deterministic mode may NaN-fill every torch.empty (a guard that costs a kernel each on a GPU)."""
        return True

    def graph_capture(self) -> bool:
        """Whether a training step can be captured once and replayed as a CUDA graph."""
        return False

    def tf32(self) -> bool:
        """Whether fp32 products may run in TF32 here (torch's float32 matmul precision below `highest`)."""
        return False

    def facts(self, device: torch.device, host_cpu: str) -> dict[str, str]:
        """What names the device in recorded machine facts: `device_name`, and its runtime where it has one."""
        return {"device_name": host_cpu if self.on_host else self.name}

    def reset_peak_memory(self, device: torch.device) -> int | None:
        """Start counting the allocator's peak; the bytes allocated now, or None where it keeps no statistics."""
        return None

    def peak_memory(self, device: torch.device) -> int | None:
        """The allocator's most allocated bytes since reset_peak_memory, or None where it keeps no statistics."""
        return None

    def resident(self, device: torch.device) -> tuple[int, str]:
        """What the process holds from the system for this device, in bytes, and what that number is."""
        pages = int(Path("/proc/self/statm").read_text().split()[1])
        return pages * os.sysconf(
            "SC_PAGE_SIZE"
        ), "the timing process's resident set (all its combinations and libraries)"

    def energy_source(self, index: int) -> tuple[str, str]:
        """The energy counter the timing processes read (pipeline.devices.counters.open_counter: `rapl`, `gpu:<i>`)
        or "" for none, and where there is none, why, in words for the report."""
        return "", f"no energy counter is read on a {self.name} device"

    def power_state(self, index: int) -> GpuPowerState | Unavailable | None:
        """What sets its energy per step besides the work (power cap, clocks), read now; None: nothing to read."""
        return None

    def allocated_size(self, nbytes: int) -> int:
        """The bytes its allocator counts for a tensor of `nbytes`."""
        if self.allocator_block_bytes <= 1:
            return nbytes
        return max(1, -(-nbytes // self.allocator_block_bytes)) * self.allocator_block_bytes
