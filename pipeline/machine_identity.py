"""Which machine a run came from: a readable name and a stable id, set as tags on every MLflow run.

With one shared tracking server, runs from a whole class land in one store; these two tags let the
MLflow UI filter and group by machine (search box: `tags."machine.name" LIKE '%H100%'`) and let
`python -m pipeline.machines` put machines side by side.

- `machine.id` hashes the machine fingerprint (pipeline.hardware: CPU, cores, GPUs, OS, Python,
  torch, CUDA build): the same facts whose change makes the profile stages rerun, so two runs share
  an id exactly when their results are measured in the same environment. Identical machines share
  an id; a label (below) tells them apart.
- `machine.name` is readable: GPU model(s) plus CPU model and vCPU count, or a label the user sets
  with $LAB_MACHINE_LABEL (an environment variable, not a params.yaml key: params.yaml is committed
  and shared, a label belongs to one machine).

Torch-free and MLflow-free: imported by pipeline.tracking for every stage, and by the machines report.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections import Counter
from collections.abc import Mapping

from pipeline.errors import PipelineError
from pipeline.hardware import machine_fingerprint

LABEL_VARIABLE = "LAB_MACHINE_LABEL"
LABEL_MAX_CHARS = 64
# The keys of pipeline.hardware.machine_fingerprint() (checked by a test): profile runs log them as
# `hardware.<key>` params, so the id of a run logged before these tags existed can be recomputed.
IDENTITY_KEYS = ("cpu", "cpu_count", "gpus", "os", "machine", "python", "torch", "torchvision", "torch_cuda_build")
NAME_TAG = "machine.name"
ID_TAG = "machine.id"
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


def identity_tags(fingerprint: Mapping[str, str], label: str | None = None) -> dict[str, str]:
    return {NAME_TAG: machine_name(fingerprint, label), ID_TAG: machine_id(fingerprint, label)}


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


def machine_tags() -> dict[str, str]:
    """This machine's `machine.name` and `machine.id` tags (what open_tracker sets on every run)."""
    return identity_tags(machine_fingerprint(), machine_label())
