"""Profile one batch size × device × mode: honest step timing, then torch.profiler's operator table.

Two phases after an untimed warm-up (oneDNN/cuDNN create kernels per input shape, so a cold first
step can cost 20x a warm one): first `active_steps` steps timed with a wall clock and no profiler
attached (profiler hooks would inflate the times), then as many steps traced by torch.profiler for
the per-operator table, the FLOPs and the Chrome/Perfetto trace.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import json
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.profiler import ProfilerActivity, profile, schedule

from pipeline.checkpoint import load_checkpoint
from pipeline.config import ProfileConfig, ProfileMode
from pipeline.cuda_graph import make_graphable_step, time_graph_replays
from pipeline.data import load_split
from pipeline.errors import PipelineError
from pipeline.model import LabNet
from pipeline.profile_record import (
    PROFILE_PRECISION,
    Combination,
    OperatorRow,
    ProfileRecord,
    ProfileSettings,
    Timing,
)
from pipeline.runtime import hardware_description, select_device
from pipeline.training import MEMORY_FORMAT, normalize_images

BOOKKEEPING_PREFIXES = ("ProfilerStep",)  # the profiler's own per-step ranges, not operators
_MEGABYTE = 1 << 20


@dataclass(frozen=True)
class ProfileResult:
    combination: Combination
    step_times_ms: tuple[float, ...]
    operators: tuple[OperatorRow, ...]  # every operator, most expensive first
    peak_memory_mb: float  # most memory torch had allocated on the device during the measured steps

    def timing(self) -> Timing:
        times = sorted(self.step_times_ms)
        mean = statistics.fmean(times)
        p95_index = min(len(times) - 1, round(0.95 * (len(times) - 1)))
        top = self.operators[0] if self.operators else None
        return Timing(
            step_time_ms_mean=mean,
            step_time_ms_p50=statistics.median(times),
            step_time_ms_p95=times[p95_index],
            step_time_cv=statistics.stdev(times) / mean if len(times) > 1 and mean else 0.0,
            per_sample_ms=mean / self.combination.batch_size,
            throughput_samples_per_s=1000.0 * self.combination.batch_size / mean,
            peak_memory_mb=self.peak_memory_mb,
            top_operator_share_pct=top.share_pct if top else 0.0,
        )


def make_step(
    model: LabNet, mode: ProfileMode, images: torch.Tensor, labels: torch.Tensor, lr: float
) -> Callable[[], None]:
    """One inference forward (eval, no autograd) or one training step (forward, backward, Adadelta at `lr`)."""
    if mode == "inference":
        model.eval()

        def inference_step() -> None:
            with torch.inference_mode():
                model(images)

        return inference_step
    model.train()
    optimizer = torch.optim.Adadelta(model.parameters(), lr=lr)  # the lab's optimizer: its update is profiled too

    def training_step() -> None:
        optimizer.zero_grad(set_to_none=True)
        F.nll_loss(model(images), labels).backward()  # type: ignore[no-untyped-call]
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


def operator_table(averages: list[Any], steps: int, on_gpu: bool) -> tuple[OperatorRow, ...]:
    """Per-step rows of every operator, sorted by self device time on GPU and self CPU time on CPU."""
    events = [event for event in averages if not event.key.startswith(BOOKKEEPING_PREFIXES)]
    time_field = "self_device_time_total" if on_gpu else "self_cpu_time_total"

    def sort_key(event: Any) -> float:
        return float(getattr(event, time_field))

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


def operators_markdown(record: ProfileRecord) -> str:
    combination, timing, rows = record.combination, record.timing, record.top_operators
    ranked_by = "self device (GPU) time" if combination.device == "cuda" else "self CPU time"
    lines = [
        f"### Top {len(rows)} operators: batch {combination.batch_size}, {combination.device}, {combination.mode}",
        "",
        f"Step time {timing.step_time_ms_mean:.3f} ms mean (p50 {timing.step_time_ms_p50:.3f}, "
        f"p95 {timing.step_time_ms_p95:.3f}, CV {timing.step_time_cv:.1%}); "
        f"{timing.per_sample_ms:.4f} ms per sample; {timing.throughput_samples_per_s:.0f} samples/s. "
        f"Ranked by {ranked_by}; times are per step.",
        "",
        "| # | operator | calls | self CPU ms | total CPU ms | self GPU ms | share % | MFLOPs |",
        "| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    graph = record.graph_metrics()
    if graph:
        lines[3:3] = [
            "",
            f"The same step replayed from a CUDA graph: {graph['graph_step_time_ms_p50']:.3f} ms p50. Host overhead "
            f"(eager - graph, p50): {graph['host_overhead_ms']:.3f} ms, {graph['host_overhead_pct']:.0f} % of the eager "
            "step: launching kernels one by one from Python, which a replay leaves out.",
        ]
    for rank, row in enumerate(rows, start=1):
        lines.append(
            f"| {rank} | `{row.operator}` | {row.calls_per_step:g} | {row.self_cpu_ms:.3f} | {row.total_cpu_ms:.3f} | "
            f"{row.self_device_ms:.3f} | {row.share_pct:.1f} | {row.mflops:.1f} |"
        )
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ProfileSetup:
    """Everything one combination is measured with, resolved from params, checkpoint and data."""

    combination: Combination
    device: torch.device
    step: Callable[[], None]
    hardware: dict[str, str]
    settings: ProfileSettings
    data_digest: str
    graph_step: Callable[[], None] | None = None  # cuda: the same step, capturable, on a copy of the model


def prepare_profile(combination: Combination, config: ProfileConfig, checkpoint_path: Path, data_root: Path) -> ProfileSetup:
    """Pick the device and threads, load the trained model and one batch of test images onto it."""
    device = select_device(combination.device, param="profile.devices")
    if config.threads:
        torch.set_num_threads(config.threads)
    checkpoint = load_checkpoint(checkpoint_path)
    model = checkpoint.model.to(device).to(memory_format=MEMORY_FORMAT)
    test_images, test_labels = load_split(data_root, "test")
    if combination.batch_size > len(test_labels):
        raise PipelineError(
            f"`profile.batch_sizes` has {combination.batch_size}, more than the {len(test_labels)} test images "
            "a batch is drawn from; use a smaller batch size."
        )
    images = normalize_images(test_images[: combination.batch_size], device).contiguous(memory_format=MEMORY_FORMAT)
    labels = torch.from_numpy(test_labels[: combination.batch_size].astype("int64")).to(device)
    lr = float(checkpoint.train_params["lr"])
    settings = ProfileSettings(
        threads=torch.get_num_threads(),
        precision=PROFILE_PRECISION,
        memory_format=str(MEMORY_FORMAT).removeprefix("torch."),
        warmup_steps=config.warmup_steps,
        active_steps=config.active_steps,
        optimizer_lr=lr,
    )
    return ProfileSetup(
        combination=combination,
        device=device,
        step=make_step(model, combination.mode, images, labels, lr),
        hardware=hardware_description(device),
        settings=settings,
        data_digest=checkpoint.data_digest,
        graph_step=(
            make_graphable_step(copy.deepcopy(model), combination.mode, images, labels, lr) if device.type == "cuda" else None
        ),
    )


def run_profile(setup: ProfileSetup, top_k: int, trace_path: Path) -> ProfileRecord:
    """Time and trace the combination; the record keeps the `top_k` most expensive operators."""
    settings = setup.settings
    result = profile_combination(
        setup.combination, setup.step, setup.device, settings.warmup_steps, settings.active_steps, trace_path
    )
    graph_times: tuple[float, ...] = ()
    if setup.graph_step is not None:  # after the eager passes, so that graph memory pools stay out of them
        graph_times = time_graph_replays(setup.graph_step, settings.warmup_steps, settings.active_steps)
    return ProfileRecord(
        combination=setup.combination,
        hardware=setup.hardware,
        settings=settings,
        timing=result.timing(),
        step_times_ms=result.step_times_ms,
        top_operators=result.operators[:top_k],
        data_digest=setup.data_digest,
        graph_step_times_ms=graph_times,
    )


def run_parameters(setup: ProfileSetup, top_k: int) -> dict[str, object]:
    """What the MLflow run of one combination records as params."""
    settings = setup.settings
    return {
        **dataclasses.asdict(setup.combination),
        "threads": settings.threads,
        "precision": settings.precision,
        "memory_format": settings.memory_format,
        "optimizer_lr": settings.optimizer_lr,
        "profile.warmup_steps": settings.warmup_steps,
        "profile.active_steps": settings.active_steps,
        "profile.top_k": top_k,
        **{f"hardware.{key}": value for key, value in setup.hardware.items()},
    }
