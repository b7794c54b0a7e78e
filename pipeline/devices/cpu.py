"""The host's CPU cores, through oneDNN and torch's own kernels."""

from __future__ import annotations

from typing import TYPE_CHECKING

from pipeline.devices.kind import DeviceKind

if TYPE_CHECKING:
    import torch


class CpuKind(DeviceKind):
    def native_bf16(self, device: torch.device) -> bool:
        import torch

        # AVX512-BF16 or AMX instructions; without them oneDNN emulates bf16 and is slower than fp32.
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, check, lambda: False)() for check in checks)

    def energy_source(self, index: int) -> tuple[str, str]:
        from pipeline.devices.counters import Unavailable, rapl_counters

        found = rapl_counters()
        return ("rapl", "") if not isinstance(found, Unavailable) else ("", f"CPU energy (RAPL) {found.reason}")


KIND = CpuKind(
    name="cpu",
    torch_type="cpu",
    label="CPU",
    colour="tab:blue",
    where="any machine",
    on_host=True,
    support="tested",
    auto_rank=2,
    trace_device_type=0,
    allocator_block_bytes=1,
    matrix_size=2048,  # 2 x 2048^3 = 17 GFLOP a product
    triad_elements=1 << 25,  # 3 x 128 MiB
    time_ranked_by="self CPU time",
    names={"en": "CPU", "zh": "CPU"},
)
