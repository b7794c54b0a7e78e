"""An NVIDIA GPU through CUDA: kernels queued asynchronously, the caching allocator's statistics, NVML's energy."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.devices.counters import GpuPowerState, Unavailable, gpu_power_state
from pipeline.devices.kind import DeviceKind

if TYPE_CHECKING:
    import torch

NVIDIA_GPUS = Path("/proc/driver/nvidia/gpus")  # one folder per GPU the NVIDIA driver has found


class CudaKind(DeviceKind):
    def missing(self) -> str | None:
        if NVIDIA_GPUS.is_dir() and any(NVIDIA_GPUS.iterdir()):
            return None
        return f"this machine shows no NVIDIA GPU ({NVIDIA_GPUS} lists none)"

    def unusable(self, param: str) -> str | None:
        import torch

        if torch.cuda.is_available():
            return None
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        return (
            f"`{param}` is '{self.name}' but no CUDA GPU is usable here (torch {torch.__version__} is {built}; "
            f"torch.cuda.is_available() is False). Set `{param}: cpu` or `auto` in params.yaml, "
            "or run on a machine with an NVIDIA GPU and driver."
        )

    def synchronize(self, device: torch.device) -> None:
        import torch

        torch.cuda.synchronize(device)

    def native_bf16(self, device: torch.device) -> bool:
        import torch

        return bool(torch.cuda.is_bf16_supported(including_emulation=False))

    def fills_uninitialized_memory(self) -> bool:
        # Deterministic mode's NaN-fill of every torch.empty (a guard against reading memory nothing wrote; results
        # are the same without it) adds about as many kernels to a training step of this CNN as the step's own.
        return False

    def graph_capture(self) -> bool:
        return True

    def tf32(self) -> bool:
        import torch

        return torch.get_float32_matmul_precision() != "highest"  # "highest": no TF32

    def facts(self, device: torch.device, host_cpu: str) -> dict[str, str]:
        import torch

        return {"device_name": torch.cuda.get_device_name(device), "cuda_runtime": str(torch.version.cuda)}

    def reset_peak_memory(self, device: torch.device) -> int | None:
        import torch

        torch.cuda.reset_peak_memory_stats(device)
        return int(torch.cuda.memory_allocated(device))

    def peak_memory(self, device: torch.device) -> int | None:
        import torch

        return int(torch.cuda.max_memory_allocated(device))

    def resident(self, device: torch.device) -> tuple[int, str]:
        import torch

        return int(torch.cuda.max_memory_reserved(device)), "the most the CUDA caching allocator reserved"

    def energy_source(self, index: int) -> tuple[str, str]:
        return f"gpu:{index}", ""

    def power_state(self, index: int) -> GpuPowerState | Unavailable | None:
        return gpu_power_state(index)


KIND = CudaKind(
    name="cuda",
    torch_type="cuda",
    label="GPU",
    colour="tab:green",
    where="a machine with an NVIDIA GPU and driver",
    on_host=False,
    support="tested",
    auto_rank=0,
    trace_device_type=1,
    allocator_block_bytes=512,  # the caching allocator hands out and counts multiples of 512 bytes
    matrix_size=4096,  # 2 x 4096^3 = 137 GFLOP a product
    triad_elements=1 << 28,  # 3 x 1 GiB, far beyond any L2
    time_ranked_by="self device (GPU) time",
    names={"en": "GPU (CUDA)", "zh": "CUDA GPU"},
)
