"""This machine's two roofs, as the `roofs` stage records them in `hardware/roofs.json` (torch-free).

The `roofs` stage measures them once per machine (pipeline.profiling.peak); every profile stage reads the
roof of its device from here, and the report draws the roofline with both. Like the profile record, the file
is rebuilt into typed dataclasses, so a missing or renamed field is a clear error naming the fix.
"""

from __future__ import annotations

import dataclasses
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from pipeline.records.profile import read_typed_json
from pipeline.records.statistics import prediction_interval

# 2: each device's speed drift (`SpeedDrift`), which the report states once as the machine's.
# 3: the compute roof is the fastest of every fp32 product library timed (`matmul_kernels`), not torch.mm's alone.
ROOFS_FORMAT = 3


@dataclass(frozen=True)
class Roof:
    """One ceiling over `repeats` timed repeats: the fastest is the roof; median and slowest show its stability."""

    best: float
    median: float
    worst: float
    repeats: int

    @property
    def spread_pct(self) -> float:
        """How far the median fell below the best, in % of the best."""
        return 100.0 * (self.best - self.median) / self.best if self.best > 0 else 0.0


@dataclass(frozen=True)
class SpeedDrift:
    """How far this machine's speed moves over time: one fixed workload timed in consecutive windows.

    On a shared VM the other tenants' load changes over seconds to minutes and slows everything it shares
    caches and cores with, invisible from inside (no steal time, no CPU pressure). A profile stage's timing
    processes run within seconds of each other, so their spread misses that; this probe, measured once per
    machine by the `roofs` stage, says how much a rerun minutes later can move every row together. The report
    states it once, as the machine's; it is in no row's interval and no ratio's (a paired ratio cancels it).
    """

    window_s: float  # each window's length
    window_medians_ms: tuple[float, ...]  # the workload's median time in each window, in order
    workload: str  # what was timed

    @property
    def spread_pct(self) -> float:
        """Standard deviation of the windows' log medians, in % (0 with fewer than two windows)."""
        if len(self.window_medians_ms) < 2 or min(self.window_medians_ms) <= 0:
            return 0.0
        return 100.0 * statistics.stdev(math.log(value) for value in self.window_medians_ms)

    @property
    def half_width_pct(self) -> float:
        """95 % prediction half-width for the speed of one more window, in %: t(n-1) · s · sqrt(1 + 1/n) on the
        log scale (0 when not measured)."""
        found = prediction_interval(self.window_medians_ms)
        return 0.0 if found is None else 100.0 * math.expm1(math.log(found[1] / found[0]) / 2)

    @property
    def method(self) -> str:
        return (
            f"{self.workload}, its median time in each of {len(self.window_medians_ms)} consecutive "
            f"{self.window_s:g}-s windows (spread {self.spread_pct:.1f} %)"
        )


@dataclass(frozen=True)
class KernelRoof:
    """The same fp32 n x n @ n x n product through one library: its GFLOP/s over the repeats."""

    kernel: str  # what computed it: "torch.mm" (BLAS on a CPU, cuBLAS on a GPU) or "oneDNN 1x1 convolution"
    gflops_per_s: Roof


@dataclass(frozen=True)
class DeviceRoofs:
    device: str  # cpu | cuda | mps
    # The compute roof: the fastest of `matmul_kernels` (fp32 n x n @ n x n products, 2 n^3 FLOPs each), the
    # one `matmul_kernel` names. One library is not enough: a CPU's BLAS sgemm behind torch.mm can run well below
    # oneDNN's kernels, which run the model's convolutions, and a roof from it alone puts steps above 100 %.
    matmul_gflops_per_s: Roof
    matmul_kernel: str
    matmul_kernels: tuple[KernelRoof, ...]
    triad_gb_per_s: Roof  # a = b + s * c over three arrays of `triad_elements` fp32 values (12 bytes each)
    matrix_size: int
    triad_elements: int
    threads: int  # CPU threads torch used
    tf32: bool  # whether cuBLAS was allowed TF32 for fp32 products (torch's default: no)
    speed_drift: SpeedDrift  # how far the device's speed moves over time (profile.drift_probe_s; none: 0 windows)

    @property
    def ridge_flops_per_byte(self) -> float:
        """Arithmetic intensity where the two roofs meet: below it an operation is memory-bound."""
        bandwidth = self.triad_gb_per_s.best
        return self.matmul_gflops_per_s.best / bandwidth if bandwidth > 0 else 0.0

    @property
    def method(self) -> str:
        products = f"fastest of {self.matmul_gflops_per_s.repeats} fp32 {self.matrix_size}x{self.matrix_size} matrix"
        tf32 = ", TF32 allowed" if self.tf32 else ""
        if len(self.matmul_kernels) == 1:
            return f"{products} products ({self.matmul_kernel}{tf32}; {self.threads} CPU thread{_plural(self.threads)})"
        each = " and ".join(
            f"{kernel.kernel} ({kernel.gflops_per_s.best:.1f} GFLOP/s)" for kernel in self.matmul_kernels
        )
        fastest = f"the faster: {self.matmul_kernel}{tf32}"
        return (
            f"{products} products through each of {each}, {fastest}; {self.threads} CPU thread{_plural(self.threads)}"
        )

    def summary_metrics(self) -> dict[str, float]:
        """What the roofs stage logs to MLflow per device (each product library's roof by its first word)."""
        return {
            "matmul_gflops_per_s": self.matmul_gflops_per_s.best,
            "matmul_gflops_per_s_median": self.matmul_gflops_per_s.median,
            "triad_gb_per_s": self.triad_gb_per_s.best,
            "triad_gb_per_s_median": self.triad_gb_per_s.median,
            "ridge_flops_per_byte": self.ridge_flops_per_byte,
            "speed_drift_pct": self.speed_drift.half_width_pct,
            **{
                f"matmul_gflops_per_s_{kernel.kernel.split()[0].replace('.', '_').lower()}": kernel.gflops_per_s.best
                for kernel in self.matmul_kernels
            },
        }

    def summary_line(self) -> str:
        """The roofs stage's console line for this device."""
        others = "".join(
            f"; {kernel.kernel} {kernel.gflops_per_s.best:.1f}"
            for kernel in self.matmul_kernels
            if kernel.kernel != self.matmul_kernel
        )
        return (
            f"{self.device}: {self.matmul_gflops_per_s.best:.1f} GFLOP/s through {self.matmul_kernel} (median "
            f"{self.matmul_gflops_per_s.median:.1f}{others}), {self.triad_gb_per_s.best:.1f} GB/s (median "
            f"{self.triad_gb_per_s.median:.1f}); ridge at {self.ridge_flops_per_byte:.1f} FLOP/byte; speed drift "
            f"±{self.speed_drift.half_width_pct:.1f} %"
        )

    @property
    def bandwidth_method(self) -> str:
        return (
            f"fastest of {self.triad_gb_per_s.repeats} STREAM triads a = b + s*c over 3 x "
            f"{self.triad_elements * 4 / 2**20:.0f} MiB fp32 arrays (12 bytes per element; {self.threads} CPU threads)"
        )


@dataclass(frozen=True)
class MachineRoofs:
    fingerprint: dict[str, str]  # hardware/fingerprint.json when they were measured
    devices: tuple[DeviceRoofs, ...]
    format: int = ROOFS_FORMAT

    def for_device(self, device: str) -> DeviceRoofs | None:
        return next((roofs for roofs in self.devices if roofs.device == device), None)


def write_roofs(roofs: MachineRoofs) -> str:
    return json.dumps(dataclasses.asdict(roofs), indent=2, sort_keys=True) + "\n"


def read_roofs(path: Path) -> MachineRoofs:
    """Read `hardware/roofs.json`; a missing or foreign file is a user error naming the fix."""
    fix = "run `dvc repro roofs` (it measures this machine's roofs once)."
    return read_typed_json(path, MachineRoofs, "roofs file", (ROOFS_FORMAT,), fix)


def _plural(count: int) -> str:
    return "" if count == 1 else "s"
