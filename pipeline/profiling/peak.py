"""The device's attainable fp32 FLOP/s, measured: the ceiling achieved FLOP/s is compared with.

A datasheet peak is a number no PyTorch program reaches (it assumes every unit busy every cycle, and
on NVIDIA parts it is often quoted for TF32 or with sparsity); a large fp32 matrix multiply through
the same library the model uses (oneDNN/MKL on the CPU, cuBLAS on the GPU) is what this machine can
actually do, and it is measured with the same thread count as the profile. It takes well under a
second: a few warm-up products, then the fastest of `repeats` timed ones. The fastest, not the
median: other work on the machine only ever slows a product down, so the fastest repeat is the
closest to what the hardware can do (the same reasoning as `timeit`'s minimum).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import torch

# Big enough to keep every core (or every SM) busy, small enough to take < 0.1 s per product:
# 2 * 1024^3 = 2.1 GFLOP on a CPU, 2 * 4096^3 = 137 GFLOP on a GPU.
MATRIX_SIZE = {"cpu": 1024, "cuda": 4096, "mps": 2048}


@dataclass(frozen=True)
class PeakMeasurement:
    device: str  # cpu | cuda | mps
    gflops_per_s: float  # of the fastest timed repeat
    matrix_size: int  # n of the n x n @ n x n product
    repeats: int
    threads: int  # CPU threads torch used
    tf32: bool  # whether cuBLAS was allowed TF32 for fp32 matmuls (torch's default: no)

    @property
    def method(self) -> str:
        return (
            f"fastest of {self.repeats} fp32 {self.matrix_size}x{self.matrix_size} matrix products "
            f"(torch.mm{', TF32 allowed' if self.tf32 else ''}; {self.threads} CPU threads)"
        )


def measure_peak(device: torch.device, repeats: int = 7, warmup: int = 2, size: int | None = None) -> PeakMeasurement:
    """Achievable fp32 matmul FLOP/s on `device` (one n x n product is 2 n^3 floating-point operations)."""
    n = size or MATRIX_SIZE.get(device.type, 1024)
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(n, n, generator=generator).to(device)
    right = torch.randn(n, n, generator=generator).to(device)
    output = torch.empty(n, n, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        elif device.type == "mps":
            torch.mps.synchronize()

    for _ in range(warmup):
        torch.mm(left, right, out=output)
    sync()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        torch.mm(left, right, out=output)
        sync()
        seconds.append(time.perf_counter() - started)
    tf32 = device.type == "cuda" and torch.get_float32_matmul_precision() != "highest"  # "highest": no TF32
    return PeakMeasurement(
        device=device.type,
        gflops_per_s=2 * n**3 / min(seconds) / 1e9,
        matrix_size=n,
        repeats=repeats,
        threads=torch.get_num_threads(),
        tf32=tf32,
    )
