"""The `validate` stage's work: all of params.yaml checked, then a marker whose content never changes, and this
machine's fingerprint (hardware/fingerprint.json), which changes only on other hardware.

One stage does both because DVC runs both at every `dvc repro` (`always_changed`), and DVC's own cost of running a
stage (it reads and rewrites the whole dvc.lock) is several times the work: two such stages made a `dvc repro`
with nothing to do slower than one (docs/measurements.md)."""

from __future__ import annotations

import json
import os
import shutil
import sys
from collections.abc import Mapping
from pathlib import Path

from pipeline.common.dataset import MIRROR_ENV_VAR, MNIST_FILES, SPLIT_IMAGES
from pipeline.common.errors import PipelineError
from pipeline.common.machine import machine_fingerprint
from pipeline.common.outputs import MIN_FREE_BYTES, AtomicOutputs, size_text
from pipeline.common.paths import DATA_ROOT, HARDWARE_FINGERPRINT, PARAMS_CHECKED, STAGE_OUTPUT_FOLDERS
from pipeline.devices.registry import device_kind, device_names
from pipeline.params.loading import DEFAULT_PARAMS_FILE, load_params
from pipeline.params.schema import Params

# Constant on purpose, to the byte: other stages depend on this file only so that DVC runs the check before
# them. Were it to change (with params, or an edit of its words: it still names the module's old path,
# pipeline/config.py), every stage would rerun.
MARKER_TEXT = (
    "params.yaml passed `python -m stages.validate` (pipeline/config.py). Every stage depends on this file\n"
    "so that DVC checks params before running, or deleting the outputs of, any other stage.\n"
)


def write_params_checked(
    params_file: Path = DEFAULT_PARAMS_FILE, marker: Path = PARAMS_CHECKED, fingerprint: Path = HARDWARE_FINGERPRINT
) -> None:
    """Validate `params_file` (values, and whether it fits this machine) and this machine's side of them
    (`check_environment`); if it passes, write `marker` and this machine's `fingerprint`, each only when its
    content differs (an unchanged file keeps its bytes and mtime: DVC reruns nothing after it)."""
    params = load_params(params_file)
    check_environment(params)
    for note in capped_values(params) + untested_devices(params):
        print(note, file=sys.stderr)
    wanted = {marker: MARKER_TEXT, fingerprint: json.dumps(machine_fingerprint(), indent=2, sort_keys=True) + "\n"}
    changed = {path: text for path, text in wanted.items() if not (path.is_file() and path.read_text() == text)}
    if changed:
        with AtomicOutputs() as outputs:
            for path, text in changed.items():
                outputs.write_text(path, text)
    print(f"{params_file} is valid -> {marker}; this machine -> {fingerprint}" + ("" if changed else " (unchanged)"))


def capped_values(params: Params) -> list[str]:
    """One note per accepted value that the stages cap, said once per `dvc repro` (here, in `validate`) rather
    than once per stage that caps it."""
    profile = params.profile
    notes = []
    if profile.program_starts > profile.processes:
        notes.append(
            f"note: `profile.program_starts` is {profile.program_starts}, more than `profile.processes` "
            f"({profile.processes}): each profile stage starts {profile.processes}, one per timing process. Set it "
            f"to at most {profile.processes} in params.yaml to say what runs."
        )
    return notes


def untested_devices(params: Params) -> list[str]:
    """One note per device kind params.yaml asks for that is defined but never run by this project's tests."""
    asked = dict.fromkeys([params.train.device, *params.profile.devices])
    return [
        f"note: device kind `{name}` is defined (pipeline/devices/) but not tested by this project: its "
        'stages should run, but no test has checked their results on such a device (docs/extending.md, "Device '
        'kinds").'
        for name in asked
        if name in device_names() and device_kind(name).support == "untested"
    ]


def check_environment(params: Params, root: Path = Path("."), environ: Mapping[str, str] = os.environ) -> None:
    """What params.yaml asks of this machine, checked before DVC deletes any stage's outputs: each
    stage would refuse the same, but only after DVC had removed its outputs. Torch-free and fast: it runs at
    every `dvc repro` (`always_changed`), so it lists a few folders and reads no data.

    - a device kind this machine lacks (its kind's `missing`: a `cuda` device where the NVIDIA driver shows no GPU);
    - `train.train_samples` / `train.test_samples` beyond the MNIST split;
    - `$MNIST_MIRROR`, only when the download stage would need it (no verified data set in place);
    - room for every stage's outputs (pipeline.common.outputs.check_output_folder: writable, 64 MiB free).
    """
    for param, device in [("train.device", params.train.device)] + [
        ("profile.devices", d) for d in params.profile.devices
    ]:
        problem = None if device == "auto" else device_kind(device).missing()
        if problem:
            raise PipelineError(f"`{param}` asks for {device}, but {problem}; set it to cpu in params.yaml.")
    for param, split, value in (
        ("train.train_samples", "train", params.train.train_samples),
        ("train.test_samples", "test", params.train.test_samples),
    ):
        if value > SPLIT_IMAGES[split]:
            raise PipelineError(
                f"`{param}` is {value:,}, but the MNIST {split} split has {SPLIT_IMAGES[split]:,} images; use at "
                f"most {SPLIT_IMAGES[split]:,} (0 = all) in params.yaml."
            )
    if not _data_in_place(root / DATA_ROOT):
        _check_mirror_folder(environ)
    for stage, folders in STAGE_OUTPUT_FOLDERS.items():
        for folder in folders:
            _check_room(stage, root / folder)


def _check_room(stage: str, folder: Path) -> None:
    """Like the check every stage makes of its own folders before it works (writable, MIN_FREE_BYTES free), but
    creating nothing: a folder not made yet is judged by the nearest one that exists above it."""
    existing = folder
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    fix = f"`{stage}` writes there. Nothing was run."
    if not os.access(existing, os.W_OK | os.X_OK):
        raise PipelineError(f"cannot write into {existing}/ (permission denied): make it writable. {fix}")
    free = shutil.disk_usage(existing).free
    if free < MIN_FREE_BYTES:
        raise PipelineError(
            f"{folder}/ has only {size_text(free)} free on its file system; at least {size_text(MIN_FREE_BYTES)} "
            f"are needed there. Free space on the file system holding {existing}/ and run again. {fix}"
        )


def _data_in_place(data_root: Path) -> bool:
    """The download stage's verified data set is there (its manifest and the four files): it need not run, so
    no mirror is needed (a workspace with its data must not fail because a mirror is gone)."""
    folder = data_root / "MNIST"
    return (folder / "manifest.json").is_file() and all((folder / "raw" / name).is_file() for name in MNIST_FILES)


def _check_mirror_folder(environ: Mapping[str, str]) -> None:
    local = environ.get(MIRROR_ENV_VAR, "").strip()
    if not local:
        return  # the mirrors in params.yaml: their URLs are checked with the params, their servers by download
    folder = Path(local).expanduser()
    fix = (
        f"Point ${MIRROR_ENV_VAR} at a folder holding the four MNIST IDX files (gzipped or raw), or unset it to "
        "download from the mirrors in params.yaml `data.mirrors`."
    )
    if not folder.is_dir():
        raise PipelineError(f"${MIRROR_ENV_VAR}={local!r} is not a folder, and the download stage needs it. {fix}")
    missing = [name for name in MNIST_FILES if not (folder / name).is_file() and not (folder / f"{name}.gz").is_file()]
    if missing:
        raise PipelineError(
            f"${MIRROR_ENV_VAR}={local!r} lacks {', '.join(missing)} (neither gzipped nor raw), and the download "
            f"stage needs it. {fix}"
        )
