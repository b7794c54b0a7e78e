"""Profile one batch size × device × mode: honest step timing, then torch.profiler's operator table.

Two phases after an untimed warm-up (oneDNN/cuDNN create kernels per input shape, so a cold first
step can cost 20x a warm one): first `active_steps` steps timed with a wall clock and no profiler
attached (profiler hooks would inflate the times), then as many steps traced by torch.profiler for
the per-operator table, the FLOPs and the Chrome/Perfetto trace.
"""

from __future__ import annotations

import gzip
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule

from pipeline.model import LabNet

BOOKKEEPING_PREFIXES = ("ProfilerStep",)  # the profiler's own per-step ranges, not operators
_MEGABYTE = 1 << 20


@dataclass(frozen=True)
class Combination:
    batch_size: int
    device: str  # cpu | cuda | mps
    mode: str  # inference | train

    @property
    def name(self) -> str:
        """Same order as DVC's matrix stage name `profile@<batch>-<device>-<mode>`."""
        return f"{self.batch_size}-{self.device}-{self.mode}"


@dataclass(frozen=True)
class OperatorRow:
    operator: str
    calls_per_step: float
    self_cpu_ms: float  # per step
    total_cpu_ms: float  # per step, children included
    self_device_ms: float  # per step; 0 on CPU-only runs
    total_device_ms: float
    share_pct: float  # of the step's operator time (self CPU time on CPU, self device time on GPU)
    mflops: float  # per step; 0 where the profiler has no formula for the operator


@dataclass(frozen=True)
class ProfileResult:
    combination: Combination
    step_times_ms: tuple[float, ...]
    operators: tuple[OperatorRow, ...]  # every operator, most expensive first
    peak_memory_mb: float  # most memory torch had allocated on the device during the measured steps

    def timing_metrics(self) -> dict[str, float]:
        """Metric names shared by every combination, so MLflow's Compare lines them up."""
        times = sorted(self.step_times_ms)
        mean = statistics.fmean(times)
        p95_index = min(len(times) - 1, round(0.95 * (len(times) - 1)))
        top = self.operators[0] if self.operators else None
        return {
            "step_time_ms_mean": mean,
            "step_time_ms_p50": statistics.median(times),
            "step_time_ms_p95": times[p95_index],
            "step_time_cv": statistics.stdev(times) / mean if len(times) > 1 and mean else 0.0,
            "per_sample_ms": mean / self.combination.batch_size,
            "throughput_samples_per_s": 1000.0 * self.combination.batch_size / mean,
            "peak_memory_mb": self.peak_memory_mb,
            "top_operator_share_pct": top.share_pct if top else 0.0,
        }


def make_step(model: LabNet, mode: str, images: torch.Tensor, labels: torch.Tensor) -> Callable[[], None]:
    """One inference forward (eval, no autograd) or one training step (forward, backward, Adadelta)."""
    if mode == "inference":
        model.eval()

        def inference_step() -> None:
            with torch.inference_mode():
                model(images)

        return inference_step
    model.train()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)  # the lab's optimizer: its update is profiled too

    def training_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.nll_loss(model(images), labels).backward()
        optimizer.step()

    return training_step


def synchronizer(device: torch.device) -> Callable[[], None]:
    """Wait for queued device work: without it GPU steps would time only the kernel launches."""
    if device.type == "cuda":
        return lambda: torch.cuda.synchronize(device)
    if device.type == "mps":
        return torch.mps.synchronize
    return lambda: None


def profile_combination(
    combination: Combination,
    step: Callable[[], None],
    device: torch.device,
    warmup_steps: int,
    active_steps: int,
    trace_path: Path,
) -> ProfileResult:
    sync = synchronizer(device)
    for _ in range(warmup_steps):
        step()
    sync()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    step_times = []
    for _ in range(active_steps):
        started = time.perf_counter()
        step()
        sync()
        step_times.append((time.perf_counter() - started) * 1000)

    on_gpu = device.type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_gpu else [])
    # wait 1 + warmup 1: the profiler's own start-up stays out of the traced steps.
    with profile(
        activities=activities,
        schedule=schedule(wait=1, warmup=1, active=active_steps),
        profile_memory=True,
        with_flops=True,
    ) as profiler:
        for _ in range(2 + active_steps):
            step()
            sync()
            profiler.step()
    profiler.export_chrome_trace(str(trace_path))
    operators = operator_table(profiler.key_averages(), active_steps, on_gpu)
    peak = torch.cuda.max_memory_allocated(device) if on_gpu else _peak_cpu_memory(trace_path)
    return ProfileResult(
        combination=combination,
        step_times_ms=tuple(step_times),
        operators=operators,
        peak_memory_mb=peak / _MEGABYTE,
    )


def operator_table(averages: list, steps: int, on_gpu: bool) -> tuple[OperatorRow, ...]:
    """Per-step rows of every operator, sorted by self device time on GPU and self CPU time on CPU."""
    events = [event for event in averages if not event.key.startswith(BOOKKEEPING_PREFIXES)]
    sort_key = (lambda event: event.self_device_time_total) if on_gpu else (lambda event: event.self_cpu_time_total)
    total = sum(sort_key(event) for event in events) or 1.0
    rows = [
        OperatorRow(
            operator=event.key,
            calls_per_step=event.count / steps,
            self_cpu_ms=event.self_cpu_time_total / steps / 1000,  # profiler times are microseconds
            total_cpu_ms=event.cpu_time_total / steps / 1000,
            self_device_ms=event.self_device_time_total / steps / 1000,
            total_device_ms=event.device_time_total / steps / 1000,
            share_pct=100.0 * sort_key(event) / total,
            mflops=(event.flops or 0) / steps / 1e6,
        )
        for event in events
    ]
    return tuple(sorted(rows, key=lambda row: row.share_pct, reverse=True))


def _peak_cpu_memory(trace_path: Path) -> float:
    """Peak bytes allocated by torch on the CPU during the traced steps.

    Read from the trace's `[memory]` events, whose `Total Allocated` is the allocator's running
    total at each allocation and free (weights, inputs, activations, gradients, optimizer state).
    """
    with gzip.open(trace_path, "rt") if trace_path.suffix == ".gz" else trace_path.open() as trace:
        events = json.load(trace)["traceEvents"]
    totals = [
        event["args"]["Total Allocated"]
        for event in events
        if event.get("name") == "[memory]" and event.get("args", {}).get("Device Type") == 0
    ]
    return float(max(totals, default=0))


def operators_markdown(result: ProfileResult, rows: tuple[OperatorRow, ...], on_gpu: bool) -> str:
    combination = result.combination
    metrics = result.timing_metrics()
    ranked_by = "self device (GPU) time" if on_gpu else "self CPU time"
    lines = [
        f"### Top {len(rows)} operators: batch {combination.batch_size}, {combination.device}, {combination.mode}",
        "",
        f"Step time {metrics['step_time_ms_mean']:.3f} ms mean (p50 {metrics['step_time_ms_p50']:.3f}, "
        f"p95 {metrics['step_time_ms_p95']:.3f}, CV {metrics['step_time_cv']:.1%}); "
        f"{metrics['per_sample_ms']:.4f} ms per sample; {metrics['throughput_samples_per_s']:.0f} samples/s. "
        f"Ranked by {ranked_by}; times are per step.",
        "",
        "| # | operator | calls | self CPU ms | total CPU ms | self GPU ms | share % | MFLOPs |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for rank, row in enumerate(rows, start=1):
        lines.append(
            f"| {rank} | `{row.operator}` | {row.calls_per_step:g} | {row.self_cpu_ms:.3f} | {row.total_cpu_ms:.3f} | "
            f"{row.self_device_ms:.3f} | {row.share_pct:.1f} | {row.mflops:.1f} |"
        )
    return "\n".join(lines) + "\n"
