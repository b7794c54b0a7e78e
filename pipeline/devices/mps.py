"""Apple's GPU through Metal (MPS): defined from PyTorch's documentation, never run by this project's tests."""

from __future__ import annotations

import platform
import sys
from typing import TYPE_CHECKING

from pipeline.devices.kind import DeviceKind

if TYPE_CHECKING:
    import torch


class MpsKind(DeviceKind):
    def missing(self) -> str | None:
        return None if sys.platform == "darwin" else "Apple's MPS exists only on macOS"

    def unusable(self, param: str) -> str | None:
        import torch

        if torch.backends.mps.is_available():
            return None
        return (
            f"`{param}` is '{self.name}' but Apple's Metal backend is not available on this machine "
            f"({platform.system()} {platform.machine()}). Set `{param}: cpu` or `auto` in params.yaml."
        )

    def synchronize(self, device: torch.device) -> None:
        import torch

        torch.mps.synchronize()


KIND = MpsKind(
    name="mps",
    torch_type="mps",
    label="GPU",
    colour="tab:purple",
    where="a Mac with Apple silicon",
    on_host=False,
    support="untested",
    auto_rank=1,
    trace_device_type=13,  # c10::DeviceType::MPS
    allocator_block_bytes=1,
    matrix_size=2048,
    triad_elements=1 << 25,
    time_ranked_by="self device (GPU) time",
    names={"en": "GPU (MPS)", "zh": "MPS GPU"},
)
