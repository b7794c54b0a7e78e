"""How the train stage runs its steps: `train.execution` and `train.precision`, resolved and explained.

- execution `auto` = `cuda_graph` on a CUDA device (a replayed graph removes the per-kernel launch cost
  that bounds an eager step of this small CNN there), `eager` elsewhere (CPU steps are bound by
  arithmetic; CUDA graphs exist only on CUDA).
- precision `auto` on CUDA is decided by measurement, per device and execution mode: eager bf16 autocast
  can be slower than fp32 there (the casts are extra launches) while graph-replayed bf16 is faster.
  Elsewhere: bf16 where the device computes it natively.
Both choices are recorded with the run (MLflow `runtime.*` params and the checkpoint) with the reason.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pipeline.common.errors import PipelineError
from pipeline.data.tensors import DeviceData
from pipeline.devices.registry import kind_of
from pipeline.params.schema import TrainConfig
from pipeline.training.loop import train_model
from pipeline.training.runtime import RuntimeSettings, pin_runtime, select_precision

# bf16 must beat fp32 by this fraction to be chosen: fp32 is the exact baseline, and a margin keeps
# the choice (and so the trained weights) from flipping between reruns when the two are close.
BF16_MARGIN = 0.05
# Measurement: rounds alternate fp32 and bf16 so a slow moment of the machine hits both alike.
MEASURE_ROUNDS = 3
MEASURE_SAMPLES = 128 * 64  # images per timed epoch: 128 steps at the lab's batch size


def resolve_execution(choice: str, device: torch.device) -> str:
    """`auto` → cuda_graph on CUDA, eager elsewhere; cuda_graph asked for off CUDA is a user error."""
    capture = kind_of(device).graph_capture()
    if choice == "auto":
        return "cuda_graph" if capture else "eager"
    if choice == "cuda_graph" and not capture:
        raise PipelineError(
            f"`train.execution` is 'cuda_graph' but training runs on '{device.type}': CUDA graphs exist only "
            "on NVIDIA GPUs. Set `train.execution: auto` (cuda_graph on CUDA, eager elsewhere) or `eager` in "
            "params.yaml, or `train.device: cuda` on a machine with a GPU."
        )
    return choice


@dataclass(frozen=True)
class PrecisionChoice:
    precision: str  # fp32 | bf16
    reason: str  # one line, recorded with the run

    def as_params(self) -> dict[str, str]:
        return {"precision": self.precision, "precision_reason": self.reason}


def choose_precision(
    choice: str, device: torch.device, execution: str, measure: Callable[[str], float] | None = None
) -> PrecisionChoice:
    """Resolve `train.precision`. On CUDA `auto` calls `measure(precision)` (ms per step) for fp32 and bf16."""
    if choice != "auto":
        return PrecisionChoice(choice, "set in params.yaml")
    kind = kind_of(device)
    if kind.on_host:
        precision = select_precision(choice, device)
        native = "computes bf16 natively" if precision == "bf16" else "has no native bf16 (it would be emulated)"
        return PrecisionChoice(precision, f"auto on {kind.name}: this device {native}")
    if not kind.native_bf16(device):
        return PrecisionChoice("fp32", f"auto on {kind.name}: this GPU has no native bf16")
    if measure is None:
        raise ValueError("choose_precision needs `measure` to resolve `auto` on CUDA")
    return decide_from_timings({"fp32": measure("fp32"), "bf16": measure("bf16")}, execution)


def decide_from_timings(ms_per_step: dict[str, float], execution: str) -> PrecisionChoice:
    """bf16 only if measured at least BF16_MARGIN faster than fp32; the reason quotes both times."""
    fp32, bf16 = ms_per_step["fp32"], ms_per_step["bf16"]
    precision = "bf16" if bf16 <= fp32 * (1 - BF16_MARGIN) else "fp32"
    rule = f"bf16 only if >= {BF16_MARGIN:.0%} faster"
    return PrecisionChoice(
        precision,
        f"auto on cuda, {execution}: measured {fp32:.3f} ms/step fp32, {bf16:.3f} bf16 ({rule}) -> {precision}",
    )


def measure_step_ms(
    config: TrainConfig, train: DeviceData, device: torch.device, execution: str
) -> Callable[[str], float]:
    """A `measure` for `choose_precision`: ms per step of the real training loop (execution mode,
    shuffling, logging windows) over `train`'s first MEASURE_SAMPLES images, timed in a second epoch
    so that warm-up and graph capture stay out; the median over MEASURE_ROUNDS alternating rounds.

    It trains throw-away models and draws random numbers: pin the runtime again afterwards (the train
    stage does), so that training starts from the seed.
    """
    samples = min(MEASURE_SAMPLES, len(train))
    subset = DeviceData(images=train.images[:samples], labels=train.labels[:samples])
    short = dataclasses.replace(config, epochs=2, train_samples=samples, log_every_steps=10**9)
    timings: dict[str, list[float]] = {"fp32": [], "bf16": []}

    def run(precision: str) -> float:
        pin_runtime(device, precision, config.threads, config.seed)
        result = train_model(
            short, subset, subset, device, precision, tracker=None, progress=False, execution=execution
        )
        return 1000 * result.epoch_seconds[-1] / (result.optimizer_steps // short.epochs)

    def measure(precision: str) -> float:
        if not timings[precision]:
            for _ in range(MEASURE_ROUNDS):
                for name in timings:
                    timings[name].append(run(name))
        return statistics.median(timings[precision])

    return measure


def settle_runtime(
    config: TrainConfig, device: torch.device, execution: str, train: DeviceData
) -> tuple[RuntimeSettings, PrecisionChoice]:
    """The precision to train in (measured where `auto` needs it, on the pinned threads), then the runtime
    pinned for training. Pinned twice on purpose: the measurement trains throw-away models, and training must
    start from the seed."""
    pin_runtime(device, select_precision(config.precision, device), config.threads, config.seed)
    choice = choose_precision(config.precision, device, execution, measure_step_ms(config, train, device, execution))
    return pin_runtime(device, choice.precision, config.threads, config.seed), choice
