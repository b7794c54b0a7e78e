"""The `validate` stage's work: all of params.yaml checked, then a marker whose content never changes."""

from __future__ import annotations

from pathlib import Path

from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import PARAMS_CHECKED
from pipeline.params.loading import DEFAULT_PARAMS_FILE, load_params

# Constant on purpose, to the byte: other stages depend on this file only so that DVC runs the check before
# them. Were it to change (with params, or an edit of its words: it still names the module's old path,
# pipeline/config.py), every stage would rerun.
MARKER_TEXT = (
    "params.yaml passed `python -m stages.validate` (pipeline/config.py). Every stage depends on this file\n"
    "so that DVC checks params before running, or deleting the outputs of, any other stage.\n"
)


def write_params_checked(params_file: Path = DEFAULT_PARAMS_FILE, marker: Path = PARAMS_CHECKED) -> None:
    """Validate `params_file` (values, and whether it fits this machine); write `marker` if it passes."""
    load_params(params_file)
    if marker.is_file() and marker.read_text() == MARKER_TEXT:
        return  # already there (DVC keeps it: `persist: true`): nothing to write
    with AtomicOutputs() as outputs:
        outputs.write_text(marker, MARKER_TEXT)
    print(f"{params_file} is valid -> {marker}")
