"""Devices, threads and determinism: the settings every torch stage pins and records."""

from __future__ import annotations

import os
import platform
from dataclasses import dataclass

import torch

from pipeline.common.errors import PipelineError
from pipeline.common.machine import machine_fingerprint

# cuBLAS needs a fixed workspace to be deterministic (CUDA docs, "Reproducibility"); set before first use.
_CUBLAS_WORKSPACE = ":4096:8"


def select_device(choice: str, param: str = "train.device") -> torch.device:
    """`auto` picks cuda, then mps, then cpu; an explicitly requested absent device is a user error."""
    if choice == "auto":
        if torch.cuda.is_available():
            return torch.device("cuda")
        if torch.backends.mps.is_available():
            return torch.device("mps")
        return torch.device("cpu")
    if choice == "cuda" and not torch.cuda.is_available():
        built = f"built with CUDA {torch.version.cuda}" if torch.version.cuda else "a CPU-only build"
        raise PipelineError(
            f"`{param}` is 'cuda' but no CUDA GPU is usable here (torch {torch.__version__} is {built}; "
            f"torch.cuda.is_available() is False). Set `{param}: cpu` or `auto` in params.yaml, "
            "or run on a machine with an NVIDIA GPU and driver."
        )
    if choice == "mps" and not torch.backends.mps.is_available():
        raise PipelineError(
            f"`{param}` is 'mps' but Apple's Metal backend is not available on this machine "
            f"({platform.system()} {platform.machine()}). Set `{param}: cpu` or `auto` in params.yaml."
        )
    return torch.device(choice)


def select_precision(choice: str, device: torch.device) -> str:
    """`auto` → bf16 mixed precision where `device` computes bf16 natively, else fp32."""
    if choice != "auto":
        return choice
    return "bf16" if has_native_bf16(device) else "fp32"


def has_native_bf16(device: torch.device) -> bool:
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported(including_emulation=False))
    if device.type == "cpu":
        # AVX512-BF16 or AMX instructions; without them oneDNN emulates bf16 and is slower than fp32.
        checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
        return any(getattr(torch.cpu, check, lambda: False)() for check in checks)
    return False


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
    if device.type == "cuda":
        # Deterministic mode also NaN-fills every torch.empty (a guard against reading memory nothing
        # wrote; results are the same without it): ~75 extra kernels per training step of this CNN,
        # more than the step's own, so on a GPU they cost real time. Left on for the CPU.
        torch.utils.deterministic.fill_uninitialized_memory = False  # type: ignore[attr-defined]
    torch.backends.cudnn.benchmark = False  # autotuning picks kernels by timing: not reproducible
    return RuntimeSettings(
        device=str(device), precision=precision, threads=torch.get_num_threads(), seed=seed, deterministic=True
    )


def hardware_description(device: torch.device) -> dict[str, str]:
    """Machine facts recorded with results that depend on them, plus the device actually used."""
    facts = machine_fingerprint()
    if device.type == "cuda":
        facts["device_name"] = torch.cuda.get_device_name(device)
        facts["cuda_runtime"] = str(torch.version.cuda)
    else:
        facts["device_name"] = facts["cpu"] if device.type == "cpu" else device.type
    return facts
