"""Which item of the `profile` matrix this process is — found without params values on a command line.

DVC interpolates `${item.*}` into a stage's `cmd` and runs it through a shell, before any code of
ours runs: `profile.devices: ["cpu$(touch pwned)"]` would execute `touch`. So the profile stage's
`cmd` in dvc.yaml holds no matrix value at all; DVC names the stage it runs in the DVC_STAGE
variable (`profile@64-cpu-train`, or `sub/dvc.yaml:profile@...`), and the item is looked up by
that name among the combinations of the *validated* params. A direct run names it as arguments.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

from pipeline.common.credentials import redact
from pipeline.common.errors import PipelineError
from pipeline.params.schema import ProfileConfig
from pipeline.profiling.record import Combination, combinations, parse_combination

DVC_STAGE_VARIABLE = "DVC_STAGE"  # set by DVC for every command it runs (dvc.stage.run.prepare_kwargs)
STAGE = "profile"


def stage_combination(
    config: ProfileConfig, argv: Sequence[str], environ: Mapping[str, str] = os.environ
) -> Combination:
    """This run's combination: from `argv` (`BATCH DEVICE MODE`) when given, else from DVC's stage name."""
    if argv:
        return parse_combination(list(argv))
    stage = environ.get(DVC_STAGE_VARIABLE, "")
    if not stage:
        raise PipelineError(
            "no profile combination given. Run it through DVC (`dvc repro profile@64-cpu-train`) or as "
            "`python -m stages.profile BATCH_SIZE DEVICE MODE` (e.g. 64 cpu train)."
        )
    name = stage.split("dvc.yaml:", 1)[-1]
    by_name = {combination.name: combination for combination in combinations(config)}
    prefix = f"{STAGE}@"
    if name.startswith(prefix) and name[len(prefix) :] in by_name:
        return by_name[name[len(prefix) :]]
    shown = redact(name if len(name) <= 120 else name[:117] + "...")
    raise PipelineError(
        f"DVC runs this as stage {shown!r}, which is none of the combinations params.yaml lists "
        f"(profile.batch_sizes x devices x modes: {', '.join(by_name)}). Run `dvc repro` so DVC expands the "
        "matrix from the current params.yaml."
    )
