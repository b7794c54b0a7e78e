"""Devices, threads and determinism: the settings every torch stage pins and records."""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch

from pipeline.common.errors import PipelineError
from pipeline.common.machine import CPU_MODEL, machine_fingerprint
from pipeline.devices.registry import device_kind, device_kinds, kind_of

# cuBLAS needs a fixed workspace to be deterministic (CUDA docs, "Reproducibility"); set before first use.
_CUBLAS_WORKSPACE = ":4096:8"


def select_device(choice: str, param: str = "train.device") -> torch.device:
    """`auto` picks the available kind of the lowest `auto_rank` (cuda, then mps, then cpu); an explicitly requested
    kind torch cannot use here is a user error."""
    if choice == "auto":
        ranked = sorted((k for k in device_kinds().values() if k.auto_rank is not None), key=lambda k: k.auto_rank or 0)
        return next(kind.torch_device() for kind in ranked if kind.unusable(param) is None)
    kind = device_kind(choice)
    problem = kind.unusable(param)
    if problem:
        raise PipelineError(problem)
    return kind.torch_device()


def select_precision(choice: str, device: torch.device) -> str:
    """`auto` → bf16 mixed precision where `device` computes bf16 natively, else fp32."""
    if choice != "auto":
        return choice
    return "bf16" if kind_of(device).native_bf16(device) else "fp32"


@dataclass(frozen=True)
class RuntimeSettings:
    device: str
    precision: str  # fp32 or bf16, after resolving `auto`
    threads: int
    seed: int
    deterministic: bool

    def as_params(self) -> dict[str, object]:
        return {
            "device": self.device,
            "precision": self.precision,
            "threads": self.threads,
            "seed": self.seed,
            "deterministic": self.deterministic,
        }


@dataclass(frozen=True)
class Ran:
    """How a training ran: its pinned runtime and its execution (eager or cuda_graph), as the checkpoint, MLflow and
    metrics/train_speed.json record them."""

    runtime: RuntimeSettings
    execution: str

    def as_params(self) -> dict[str, object]:
        return {**self.runtime.as_params(), "execution": self.execution}


def pin_runtime(device: torch.device, precision: str, threads: int, seed: int) -> RuntimeSettings:
    """Seed every generator, force deterministic kernels and pin the CPU thread count.

    `threads == 0` means one thread per core torch sees; the number actually used is returned so
    it can be recorded — results are bit-identical only for the same thread count.
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_WORKSPACE)
    if threads:
        torch.set_num_threads(threads)
    torch.manual_seed(seed)  # CPU and every CUDA device
    torch.use_deterministic_algorithms(True)
    if not kind_of(device).fills_uninitialized_memory():
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cudnn.benchmark = False  # autotuning picks kernels by timing: not reproducible
    return RuntimeSettings(
        device=str(device), precision=precision, threads=torch.get_num_threads(), seed=seed, deterministic=True
    )


def hardware_description(device: torch.device) -> dict[str, str]:
    """Machine facts recorded with results that depend on them, plus the device actually used."""
    facts = machine_fingerprint()
    return {**facts, **kind_of(device).facts(device, host_cpu=facts[CPU_MODEL])}
