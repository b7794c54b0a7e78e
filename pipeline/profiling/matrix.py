"""Which item of the `profile` matrix (a device) this process is — found without params values on a command line.

DVC interpolates `${item}` into a stage's `cmd` and runs it through a shell, before any code of
ours runs: `profile.devices: ["cpu$(touch pwned)"]` would execute `touch`. So the profile stage's
`cmd` in dvc.yaml holds no matrix value at all; DVC names the stage it runs in the DVC_STAGE
variable (`profile@cpu`, or `sub/dvc.yaml:profile@cpu`), and the device is looked up by
that name among the *validated* params. A direct run names it as an argument.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from pipeline.common.credentials import redact
from pipeline.common.errors import PipelineError
from pipeline.devices.registry import device_names
from pipeline.params.schema import Device, ProfileConfig

DVC_STAGE_VARIABLE = "DVC_STAGE"  # set by DVC for every command it runs (dvc.stage.run.prepare_kwargs)
STAGE = "profile"


def stage_device(config: ProfileConfig, argv: Sequence[str], environ: Mapping[str, str] = os.environ) -> Device:
    """This run's device: from `argv` (`DEVICE`, a direct run) when given, else from DVC's stage name, which must
    be one of `profile.devices`."""
    if argv:
        devices = device_names()
        if len(argv) != 1 or argv[0] not in devices:
            raise PipelineError(
                f"usage: python -m stages.profile DEVICE, with DEVICE one of {', '.join(devices)}; "
                f"got {' '.join(argv)!r}."
            )
        return argv[0]
    stage = environ.get(DVC_STAGE_VARIABLE, "")
    if not stage:
        raise PipelineError(
            "no profile device given. Run it through DVC (`dvc repro profile@cpu`) or as "
            "`python -m stages.profile DEVICE` (e.g. cpu)."
        )
    name = stage.split("dvc.yaml:", 1)[-1]
    prefix = f"{STAGE}@"
    if name.startswith(prefix) and name[len(prefix) :] in config.devices:
        return name[len(prefix) :]
    shown = redact(name if len(name) <= 120 else name[:117] + "...")
    raise PipelineError(
        f"DVC runs this as stage {shown!r}, which is none of the devices params.yaml lists "
        f"(profile.devices: {', '.join(config.devices)}). Run `dvc repro` so DVC expands the "
        "matrix from the current params.yaml."
    )
