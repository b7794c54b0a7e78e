"""The device's two roofs, measured: attainable fp32 FLOP/s and memory bandwidth (the roofline's ceilings).

A datasheet peak is a number no PyTorch program reaches (it assumes every unit busy every cycle, and
on NVIDIA parts it is often quoted for TF32 or with sparsity); a large fp32 matrix multiply through
the same library the model uses (oneDNN/MKL on the CPU, cuBLAS on the GPU) is what this machine can
actually do, and it is measured with the same thread count as the profile. The memory roof is a STREAM
triad (a = b + s·c, three arrays far larger than any cache; STREAM's count: 3 × 4 bytes per element, no
write-allocate traffic) through torch's own element-wise kernels.

Each roof is the fastest of its timed repeats, not the median: other work on the machine only ever slows an
operation down, so the fastest repeat is the closest to what the hardware can do (timeit's reasoning). The
median and the slowest are kept beside it, so a reader sees how stable it was. The `roofs` stage measures
them once per machine (its dep is the hardware fingerprint); every profile stage reads them
(`hardware/roofs.json`), so "% of peak" no longer moves 2x between stages of one `dvc repro`.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch

from pipeline.profiling.roofs import DeviceRoofs, Roof
from pipeline.profiling.timing import synchronizer

# Big enough to keep every core (or every SM) busy, small enough to take < 0.2 s per product:
# 2 * 2048^3 = 17 GFLOP on a CPU, 2 * 4096^3 = 137 GFLOP on a GPU.
MATRIX_SIZE = {"cpu": 2048, "cuda": 4096, "mps": 2048}
# fp32 elements per triad array: 3 x 128 MiB on a CPU, 3 x 1 GiB on a GPU, far beyond any L3 or L2 cache.
TRIAD_ELEMENTS = {"cpu": 1 << 25, "cuda": 1 << 28, "mps": 1 << 25}
ROOF_REPEATS = 15  # timed repeats of each roof (after WARMUP): enough for a fastest one that repeats


def _timed(operation: Callable[[], object], device: torch.device, repeats: int, warmup: int) -> list[float]:
    """Seconds of each of `repeats` runs of `operation` after `warmup` untimed ones (device synchronised)."""
    sync = synchronizer(device)
    for _ in range(warmup):
        operation()
    sync()
    seconds = []
    for _ in range(repeats):
        started = time.perf_counter()
        operation()
        sync()
        seconds.append(time.perf_counter() - started)
    return seconds


def _roof(work: float, seconds: list[float]) -> Roof:
    """`work` per run (GFLOP or GB) over each run's seconds: the fastest, the median and the slowest rate."""
    rates = sorted(work / second for second in seconds)
    return Roof(best=rates[-1], median=statistics.median(rates), worst=rates[0], repeats=len(rates))


def _tf32(device: torch.device) -> bool:
    return device.type == "cuda" and torch.get_float32_matmul_precision() != "highest"  # "highest": no TF32


def matmul_roof(device: torch.device, n: int, repeats: int) -> Roof:
    """GFLOP/s of fp32 n x n @ n x n products (2 n^3 FLOPs each) on `device`."""
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(n, n, generator=generator).to(device)
    right = torch.randn(n, n, generator=generator).to(device)
    product = torch.empty(n, n, device=device)
    return _roof(2 * n**3 / 1e9, _timed(lambda: torch.mm(left, right, out=product), device, repeats, warmup=2))


def triad_roof(device: torch.device, elements: int, repeats: int) -> Roof:
    """GB/s of the STREAM triad a = b + 3c over fp32 arrays of `elements` values (12 bytes moved per element)."""
    generator = torch.Generator().manual_seed(0)
    b = torch.rand(elements, generator=generator).to(device)
    c = torch.rand(elements, generator=generator).to(device)
    a = torch.empty(elements, device=device)
    return _roof(12 * elements / 1e9, _timed(lambda: torch.add(b, c, alpha=3.0, out=a), device, repeats, warmup=2))


def measure_roofs(
    device: torch.device, repeats: int = ROOF_REPEATS, size: int | None = None, triad_elements: int | None = None
) -> DeviceRoofs:
    """Both roofs of `device`, each over `repeats` timed repeats (the arrays of one are freed before the other)."""
    n = size or MATRIX_SIZE.get(device.type, 1024)
    elements = triad_elements or TRIAD_ELEMENTS.get(device.type, 1 << 25)
    return DeviceRoofs(
        device=device.type,
        matmul_gflops_per_s=matmul_roof(device, n, repeats),
        triad_gb_per_s=triad_roof(device, elements, repeats),
        matrix_size=n,
        triad_elements=elements,
        threads=torch.get_num_threads(),
        tf32=_tf32(device),
    )
