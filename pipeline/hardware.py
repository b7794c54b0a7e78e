"""What machine this is, cheaply: the fingerprint that hardware-bound results (profiles) depend on.

Read without importing torch (≈ 4 s), because the `hardware` stage runs on every `dvc repro`:
the torch and CUDA versions come from the installed package's metadata and `torch/version.py`,
GPUs from `nvidia-smi`.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import re
import shutil
import subprocess
from pathlib import Path


def machine_fingerprint() -> dict[str, str]:
    """CPU model and cores, GPUs, OS, Python, torch and its CUDA build: stable on one machine."""
    return {
        "cpu": cpu_model(),
        "cpu_count": str(os.cpu_count()),
        "gpus": ", ".join(nvidia_gpus()) or "none",
        "os": f"{platform.system()} {platform.release()}",
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": _package_version("torch"),
        "torchvision": _package_version("torchvision"),
        "torch_cuda_build": _torch_cuda_build(),
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass  # not Linux: platform's answer below
    return platform.processor() or platform.machine()


def nvidia_gpus() -> list[str]:
    """Names of the NVIDIA GPUs the driver sees (empty without a driver)."""
    if shutil.which("nvidia-smi") is None:
        return []
    try:
        listed = subprocess.run(
            ["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"], capture_output=True, text=True, timeout=30
        )
    except (OSError, subprocess.TimeoutExpired):
        return []
    return [line.strip() for line in listed.stdout.splitlines() if line.strip()] if listed.returncode == 0 else []


def _package_version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _torch_cuda_build() -> str:
    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        return "none"
    version_file = Path(spec.origin).with_name("version.py")
    match = re.search(r"^cuda\s*(?::\s*[^=]+)?=\s*'([^']+)'", version_file.read_text(), re.MULTILINE)
    return match.group(1) if match else "none"
