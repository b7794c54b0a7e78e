"""The device's two roofs, measured: attainable fp32 FLOP/s and memory bandwidth (the roofline's ceilings).

A datasheet peak is a number no PyTorch program reaches (it assumes every unit busy every cycle, and
on NVIDIA parts it is often quoted for TF32 or with sparsity); a large fp32 matrix multiply through
the libraries the model uses is what this machine can actually do, measured with the same thread count as
the profile. On the GPU that is cuBLAS (torch.mm). On the CPU torch has two: BLAS (MKL) behind torch.mm
and oneDNN behind the convolutions, and the same product is timed through both (oneDNN's as a 1x1
convolution): the roof is the faster. They can differ widely (MKL takes its AVX2 path on an AMD CPU with
AVX-512), and one library alone would put the model's convolutions above 100 % of "peak" (docs/measurements.md).
The memory roof is a STREAM
triad (a = b + s·c, three arrays far larger than any cache; STREAM's count: 3 × 4 bytes per element, no
write-allocate traffic) through torch's own element-wise kernels.

Each roof is the fastest of its timed repeats, not the median: other work on the machine only ever slows an
operation down, so the fastest repeat is the closest to what the hardware can do (timeit's reasoning). The
median and the slowest are kept beside it, so a reader sees how stable it was. The `roofs` stage measures
them once per machine (its dep is the hardware fingerprint); every profile stage reads them
(`hardware/roofs.json`), so every stage of one `dvc repro` states "% of roof" against the same roofs.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from pipeline.devices.registry import device_kind, host_kind, kind_of
from pipeline.profiling.timing import synchronizer
from pipeline.records.roofs import DeviceRoofs, KernelRoof, Roof, SpeedDrift

ROOF_REPEATS = 15  # timed repeats of each roof (after WARMUP): enough for a fastest one that repeats
# The drift probe's workload: a 384² fp32 product and a triad over 3 x 4 MiB, about a millisecond on a CPU core,
# a mix of the two kinds of work a lab step does (compute in cache, streaming through memory).
DRIFT_MATRIX_SIZE = 384
DRIFT_TRIAD_ELEMENTS = 1 << 20
DRIFT_WINDOWS = 8


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
    return kind_of(device).tf32()


def matmul_roof(device: torch.device, n: int, repeats: int) -> Roof:
    """GFLOP/s of fp32 n x n @ n x n products (2 n^3 FLOPs each) on `device` through torch.mm."""
    generator = torch.Generator().manual_seed(0)
    left = torch.randn(n, n, generator=generator).to(device)
    right = torch.randn(n, n, generator=generator).to(device)
    product = torch.empty(n, n, device=device)
    return _roof(2 * n**3 / 1e9, _timed(lambda: torch.mm(left, right, out=product), device, repeats, warmup=2))


# torch sends a 1x1 convolution to oneDNN on one thread only from a batch of 16 (below it, its own BLAS path).
ONEDNN_BATCH = 16


def onednn_operands(left: torch.Tensor, right: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """`left @ right` (n x n each, n >= 256 and a multiple of 16) as a 1x1 convolution, which F.conv2d sends to
    oneDNN on the CPU as it does the model's convolutions (with fewer channels, or below a batch of 16 on one
    thread, torch picks its own kernel): `right`'s n columns as the pixels of ONEDNN_BATCH images of n input
    channels, `left` as the weights of n output channels, both channels-last (the layout oneDNN computes in, so
    no reorder is timed). onednn_product(F.conv2d(pixels, weights)) is the product."""
    channels, columns = right.shape
    images = right.reshape(channels, ONEDNN_BATCH, 1, columns // ONEDNN_BATCH).permute(1, 0, 2, 3)
    pixels = images.contiguous(memory_format=torch.channels_last)
    weights = left.reshape(*left.shape, 1, 1).contiguous(memory_format=torch.channels_last)
    return pixels, weights


def onednn_product(output: torch.Tensor) -> torch.Tensor:
    """The n x n product from the convolution's output (the inverse of onednn_operands' layout)."""
    images, channels, _, width = output.shape
    return output.permute(1, 0, 2, 3).reshape(channels, images * width)


def onednn_matmul_roof(n: int, repeats: int) -> Roof:
    """GFLOP/s of the same fp32 n x n @ n x n product through oneDNN on the CPU (onednn_operands), without autograd."""
    generator = torch.Generator().manual_seed(0)
    pixels, weights = onednn_operands(*(torch.randn(n, n, generator=generator) for _ in range(2)))
    with torch.no_grad():
        return _roof(
            2 * n**3 / 1e9, _timed(lambda: F.conv2d(pixels, weights), host_kind().torch_device(), repeats, warmup=2)
        )


def matmul_kernels(device: torch.device, n: int, repeats: int) -> tuple[KernelRoof, ...]:
    """The fp32 product through every library torch uses for it on `device`: torch.mm (BLAS on the CPU,
    cuBLAS on a GPU) and, on a CPU with oneDNN, oneDNN."""
    kernels = [KernelRoof("torch.mm", matmul_roof(device, n, repeats))]
    if kind_of(device).on_host and torch.backends.mkldnn.is_available():  # type: ignore[no-untyped-call]
        kernels.append(KernelRoof("oneDNN 1x1 convolution", onednn_matmul_roof(n, repeats)))
    return tuple(kernels)


def triad_roof(device: torch.device, elements: int, repeats: int) -> Roof:
    """GB/s of the STREAM triad a = b + 3c over fp32 arrays of `elements` values (12 bytes moved per element)."""
    generator = torch.Generator().manual_seed(0)
    b = torch.rand(elements, generator=generator).to(device)
    c = torch.rand(elements, generator=generator).to(device)
    a = torch.empty(elements, device=device)
    return _roof(12 * elements / 1e9, _timed(lambda: torch.add(b, c, alpha=3.0, out=a), device, repeats, warmup=2))


def speed_drift(
    device: torch.device, seconds: float, windows: int = DRIFT_WINDOWS, progress: Callable[[], None] | None = None
) -> SpeedDrift:
    """The drift probe (`SpeedDrift`): a fixed small workload timed back to back for `seconds`, split into
    `windows` windows, each summarised by its median call time. 0 seconds: not measured (no windows)."""
    n, elements = DRIFT_MATRIX_SIZE, DRIFT_TRIAD_ELEMENTS
    workload = f"a {n}x{n} fp32 matrix product and a triad over 3 x {elements * 4 / 2**20:.0f} MiB"
    if seconds <= 0:
        return SpeedDrift(window_s=0.0, window_medians_ms=(), workload=workload)
    generator = torch.Generator().manual_seed(0)
    left, right = (torch.randn(n, n, generator=generator).to(device) for _ in range(2))
    b, c = (torch.rand(elements, generator=generator).to(device) for _ in range(2))
    product, a = torch.empty(n, n, device=device), torch.empty(elements, device=device)

    def work() -> None:
        torch.mm(left, right, out=product)
        torch.add(b, c, alpha=3.0, out=a)

    sync = synchronizer(device)
    for _ in range(5):
        work()
    sync()
    window_s = seconds / windows
    medians = []
    for _ in range(windows):
        times = []
        ends = time.perf_counter() + window_s
        while (started := time.perf_counter()) < ends:
            work()
            sync()
            times.append(time.perf_counter() - started)
        medians.append(1000.0 * statistics.median(times))
        if progress is not None:
            progress()
    return SpeedDrift(window_s=window_s, window_medians_ms=tuple(medians), workload=workload)


def measure_roofs(
    device: torch.device,
    repeats: int = ROOF_REPEATS,
    size: int | None = None,
    triad_elements: int | None = None,
    drift_probe_s: float = 0.0,
    progress: Callable[[], None] | None = None,
    name: str | None = None,
) -> DeviceRoofs:
    """Both roofs of `device` (recorded as device kind `name`: by default the kind of its torch type), each over
    `repeats` timed repeats (the arrays of one are freed before the other), and its speed drift over `drift_probe_s`
    seconds (`progress()` after each window). The workloads' sizes are its kind's."""
    kind = device_kind(name) if name else kind_of(device)
    n = size or kind.matrix_size
    elements = triad_elements or kind.triad_elements
    kernels = matmul_kernels(device, n, repeats)
    fastest = max(kernels, key=lambda kernel: kernel.gflops_per_s.best)
    return DeviceRoofs(
        device=kind.name,
        matmul_gflops_per_s=fastest.gflops_per_s,
        matmul_kernel=fastest.kernel,
        matmul_kernels=kernels,
        triad_gb_per_s=triad_roof(device, elements, repeats),
        matrix_size=n,
        triad_elements=elements,
        threads=torch.get_num_threads(),
        tf32=_tf32(device),
        speed_drift=speed_drift(device, drift_probe_s, progress=progress),
    )
