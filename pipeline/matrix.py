"""Which item of the `profile` matrix this process is — found without params values on a command line.

DVC interpolates `${item.*}` into a stage's `cmd` and runs it through a shell, before any code of
ours runs: `profile.devices: ["cpu$(touch pwned)"]` would execute `touch`. So the profile stage's
`cmd` in dvc.yaml holds no matrix value at all; DVC names the stage it runs in the DVC_STAGE
variable (`profile@64-cpu-train`, or `sub/dvc.yaml:profile@...`), and the item is looked up by
that name among the combinations of the *validated* params. A direct run names it as arguments.
"""

from __future__ import annotations

import os
import typing
from collections.abc import Mapping, Sequence

from pipeline.config import Device, ProfileConfig, ProfileMode
from pipeline.credentials import redact
from pipeline.errors import PipelineError

DVC_STAGE_VARIABLE = "DVC_STAGE"  # set by DVC for every command it runs (dvc.stage.run.prepare_kwargs)
STAGE = "profile"
USAGE = "python -m stages.profile BATCH_SIZE DEVICE MODE (e.g. 64 cpu train), or through DVC: `dvc repro profile@64-cpu-train`"
MAX_BATCH_SIZE = 10_000  # as profile.batch_sizes allows: the test set has 10,000 images


def combination_name(batch_size: int, device: str, mode: str) -> str:
    """DVC's matrix key for an item: the values joined by '-' in matrix order (batch_size, device, mode)."""
    return f"{batch_size}-{device}-{mode}"


def profile_matrix_item(
    config: ProfileConfig, argv: Sequence[str], environ: Mapping[str, str] = os.environ
) -> tuple[int, str, str]:
    """(batch size, device, mode) of this run: from `argv` when given, else from DVC's stage name."""
    if argv:
        return _from_arguments(argv)
    stage = environ.get(DVC_STAGE_VARIABLE, "")
    if not stage:
        raise PipelineError(f"no profile combination given. Run {USAGE}.")
    name = stage.split("dvc.yaml:", 1)[-1]
    items = {
        combination_name(batch, device, mode): (batch, device, mode)
        for batch in config.batch_sizes
        for device in config.devices
        for mode in config.modes
    }
    prefix = f"{STAGE}@"
    if name.startswith(prefix) and name[len(prefix) :] in items:
        return items[name[len(prefix) :]]
    shown = redact(name if len(name) <= 120 else name[:117] + "...")
    raise PipelineError(
        f"DVC runs this as stage {shown!r}, which is none of the combinations params.yaml lists "
        f"(profile.batch_sizes × devices × modes: {', '.join(items)}). Run `dvc repro` so DVC expands the "
        "matrix from the current params.yaml."
    )


def _from_arguments(argv: Sequence[str]) -> tuple[int, str, str]:
    if len(argv) != 3:
        raise PipelineError(f"expected three arguments, got {len(argv)}. Usage: {USAGE}.")
    batch_text, device, mode = argv
    problems = []
    if not (batch_text.isascii() and batch_text.isdigit() and 1 <= int(batch_text) <= MAX_BATCH_SIZE):
        problems.append(f"BATCH_SIZE {batch_text[:40]!r} must be a whole number from 1 to {MAX_BATCH_SIZE}")
    if device not in typing.get_args(Device):
        problems.append(f"DEVICE {device[:40]!r} must be one of {', '.join(typing.get_args(Device))}")
    if mode not in typing.get_args(ProfileMode):
        problems.append(f"MODE {mode[:40]!r} must be one of {', '.join(typing.get_args(ProfileMode))}")
    if problems:
        raise PipelineError(f"{'; '.join(problems)}. Usage: {USAGE}.")
    return int(batch_text), device, mode
