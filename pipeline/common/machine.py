"""What machine this is, cheaply: the fingerprint that hardware-bound results (profiles) depend on.

Read without importing torch (seconds: docs/measurements.md), because the `validate` stage writes it on every
`dvc repro`: the torch and CUDA versions come from the installed package's metadata and `torch/version.py`,
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

CPU_MODEL = "cpu"  # the fingerprint's key of the CPU model's name


def machine_fingerprint() -> dict[str, str]:
    """CPU model, family, kernel-relevant features and cores, GPUs, OS, Python, torch and its CUDA build: stable on
    one machine, and different on two machines whose CPUs run different kernels under the same model name."""
    cpu = cpu_info()
    return {
        CPU_MODEL: cpu_model(),
        "cpu_family_model": f"family {cpu['cpu family']}, model {cpu['model']}" if "cpu family" in cpu else "unknown",
        "cpu_features": kernel_features(cpu.get("flags", "")) if "flags" in cpu else "unknown",
        "cpu_count": str(os.cpu_count()),
        "gpus": ", ".join(nvidia_gpus()) or "none",
        # The kernel's version without its build suffix (`6.1.0-28-cloud-amd64` -> `6.1.0`): a rebuilt kernel of
        # the same version must not make an identical machine look like another one.
        "os": f"{platform.system()} {platform.release().split('-')[0]}",
        "machine": platform.machine(),
        "python": platform.python_version(),
        "torch": _package_version("torch"),
        "torchvision": _package_version("torchvision"),
        "torch_cuda_build": _torch_cuda_build(),
    }


# Instruction-set features that change which kernels oneDNN and ATen pick, and so the timings and, through
# `train.precision: auto` (bf16 only where native), the trained model: two "AMD EPYC" VMs differ exactly here.
KERNEL_FEATURES = (
    "avx2",
    "fma",
    "avx_vnni",
    "avx512f",
    "avx512_vnni",
    "avx512_bf16",
    "avx512_fp16",
    "amx_tile",
    "amx_bf16",
    "amx_int8",
)
# The most capable of them, for a machine's name: (flag, label), best first.
_ISA_LEVELS = (("amx_tile", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


def cpu_info() -> dict[str, str]:
    """The first processor's fields of /proc/cpuinfo (`model name`, `cpu family`, `model`, `flags`); empty off Linux."""
    fields: dict[str, str] = {}
    try:
        with open("/proc/cpuinfo") as cpuinfo:
            for line in cpuinfo:
                if not line.strip():
                    if fields:
                        break  # the first processor is enough: a VM's vCPUs are alike
                    continue
                key, _, value = line.partition(":")
                fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass  # not Linux
    return fields


def kernel_features(flags: str) -> str:
    """The KERNEL_FEATURES among /proc/cpuinfo's `flags`, in KERNEL_FEATURES' order; `none` if none."""
    present = set(flags.split())
    return " ".join(feature for feature in KERNEL_FEATURES if feature in present) or "none"


def cpu_model() -> str:
    return cpu_info().get("model name") or platform.processor() or platform.machine()


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
IDENTITY_KEYS = (
    CPU_MODEL,
    "cpu_family_model",
    "cpu_features",
    "cpu_count",
    "gpus",
    "os",
    "machine",
    "python",
    "torch",
    "torchvision",
    "torch_cuda_build",
)
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
    """The label if given, else `<GPUs> + <CPU> (<n> vCPUs[, <ISA>])` or `<CPU> (<n> vCPUs[, <ISA>])`, where ISA is
    the most capable of AMX, AVX-512 BF16, AVX-512, AVX2 the CPU has (fingerprints that record its features)."""
    if label:
        return label
    features = set(fingerprint.get("cpu_features", "").split())
    isa = next((f", {name}" for flag, name in _ISA_LEVELS if flag in features), "")
    cpu = f"{short_cpu_name(fingerprint.get(CPU_MODEL, ''))} ({fingerprint.get('cpu_count', '?')} vCPUs{isa})"
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
