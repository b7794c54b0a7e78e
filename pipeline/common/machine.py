"""What machine this is, cheaply: the fingerprint that hardware-bound results (profiles) depend on.

Read without importing torch (≈ 4 s), because the `hardware` stage runs on every `dvc repro`:
the torch and CUDA versions come from the installed package's metadata and `torch/version.py`,
GPUs from `nvidia-smi`.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shutil
import subprocess
from collections import Counter
from collections.abc import Mapping
from pathlib import Path

from pipeline.common.errors import PipelineError


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


LABEL_VARIABLE = "LAB_MACHINE_LABEL"
LABEL_MAX_CHARS = 64
# The keys of pipeline.common.machine.machine_fingerprint() (checked by a test): profile runs log them as
# `hardware.<key>` params, so the id of a run logged before these tags existed can be recomputed.
IDENTITY_KEYS = ("cpu", "cpu_count", "gpus", "os", "machine", "python", "torch", "torchvision", "torch_cuda_build")
ID_LENGTH = 12  # hex digits: 48 bits, no collision among a class's machines

# Marketing noise in /proc/cpuinfo model names: "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz",
# "AMD EPYC 7B13 64-Core Processor". The core count is given separately (vCPUs the OS sees).
_CPU_NOISE = (
    re.compile(r"\((?:R|TM|C)\)", re.IGNORECASE),
    re.compile(r"\s+CPU\b"),
    re.compile(r"\s*@\s*[\d.]+\s*[GM]Hz", re.IGNORECASE),
    re.compile(r"\s+\d+-Core\b", re.IGNORECASE),
    re.compile(r"\s+Processor\b", re.IGNORECASE),
)


def short_cpu_name(model: str) -> str:
    """`Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz` -> `Intel Xeon Platinum 8481C`."""
    short = model
    for pattern in _CPU_NOISE:
        short = pattern.sub("", short)
    short = " ".join(short.split())
    return short or model.strip() or "unknown CPU"


def gpu_summary(gpus: str) -> str:
    """`NVIDIA A100, NVIDIA A100` -> `2x NVIDIA A100`; empty for `none`."""
    names = [name.strip() for name in gpus.split(",") if name.strip() and name.strip() != "none"]
    counted = Counter(names)
    return ", ".join(f"{count}x {name}" if count > 1 else name for name, count in counted.items())


def machine_name(fingerprint: Mapping[str, str], label: str | None = None) -> str:
    """The label if given, else `<GPUs> + <CPU> (<n> vCPUs)` or `<CPU> (<n> vCPUs)`."""
    if label:
        return label
    cpu = f"{short_cpu_name(fingerprint.get('cpu', ''))} ({fingerprint.get('cpu_count', '?')} vCPUs)"
    gpus = gpu_summary(fingerprint.get("gpus", "none"))
    return f"{gpus} + {cpu}" if gpus else cpu


def machine_id(fingerprint: Mapping[str, str], label: str | None = None) -> str:
    """A stable hash of the fingerprint's identity keys (and the label, so labelled twins differ)."""
    identity = {key: str(fingerprint.get(key, "")) for key in IDENTITY_KEYS}
    if label:
        identity["label"] = label
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:ID_LENGTH]


def machine_label() -> str | None:
    """$LAB_MACHINE_LABEL, stripped; None when unset or blank. A label that would garble the UI is refused."""
    label = " ".join(os.environ.get(LABEL_VARIABLE, "").split())
    if not label:
        return None
    if len(label) > LABEL_MAX_CHARS or not label.isprintable():
        raise PipelineError(
            f"${LABEL_VARIABLE} is {label[:80]!r}: a machine label must be printable text of at most "
            f"{LABEL_MAX_CHARS} characters (e.g. `export {LABEL_VARIABLE}=alice-laptop`); shorten it or unset it."
        )
    return label
