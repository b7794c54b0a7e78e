"""Every MLflow tag name the pipeline sets or reads, defined once, and the machine's identity tags.

Tags, not params: params are write-once per run and say what was computed; tags say where a run came
from and how it links to others, and some change after the run (`dvc.outputs`).
"""

from __future__ import annotations

from collections.abc import Mapping

from pipeline.common.machine import machine_fingerprint, machine_id, machine_label, machine_name

# MLflow's own: the run's description in the UI.
NOTE_TAG = "mlflow.note.content"

# Which machine ran it (pipeline.common.machine): the UI filters and the machines report groups by these.
NAME_TAG = "machine.name"
ID_TAG = "machine.id"
# The fingerprint's facts, one tag each (`hardware.cpu`, ...).
HARDWARE_PREFIX = "hardware."

# Tags every run carries, so a later stage can tell whether the process that owns a RUNNING run is alive.
HOST_TAG = "pipeline.host"
PROCESS_TAG = "pipeline.process"
STALE_TAG = "pipeline.ended_by"

# One `dvc repro` is one parent run (pipeline.tracking.lineage); each stage run says whether its outputs
# are still the workspace's.
KEY_TAG = "pipeline.key"
COMMIT_TAG = "pipeline.commit"
PARAMS_DIGEST_TAG = "pipeline.params_digest"
OUTPUTS_TAG = "dvc.outputs"
# The folder a run's outputs went to (a queued DVC experiment runs in its own copy under .dvc/tmp/exps), and the md5
# of each (JSON {path: md5}, as dvc.lock has them): what a later stage finds a file's producer by.
WORKSPACE_TAG = "dvc.workspace"
OUTPUTS_MD5_TAG = "dvc.outs.md5"
STAGE_TAG = "stage"
# Set from DVC's environment in a `dvc exp run`.
EXPERIMENT_TAG = "dvc.experiment"
BASELINE_REV_TAG = "dvc.baseline_rev"

# Links between runs: a run that uses the trained model names the train run and the logged model.
TRAIN_RUN_TAG = "train.run_id"
MODEL_ID_TAG = "model.id"  # MLflow 3 logged model id (`m-...`), set on the train run by log_model
MODEL_URI_TAG = "model.uri"
MODEL_DIGEST_TAG = "model.digest"  # SHA-256 of models/model.pt: runs of one checkpoint share it
MODEL_DEVICE_TAG = "model.serving_device"
REGISTERED_MODEL_TAG = "model.registered_version"  # `<name>/<version>` in the MLflow Model Registry
DATA_DIGEST_TAG = "data.digest"  # of the verified MNIST files
INPUT_TAG_PREFIX = "input."  # the report run: one per run whose outputs it read


def identity_tags(fingerprint: Mapping[str, str], label: str | None = None) -> dict[str, str]:
    return {NAME_TAG: machine_name(fingerprint, label), ID_TAG: machine_id(fingerprint, label)}


def machine_tags() -> dict[str, str]:
    """This machine's `machine.name` and `machine.id` tags (what open_tracker sets on every run)."""
    return identity_tags(machine_fingerprint(), machine_label())


def hardware_tags(hardware: Mapping[str, str]) -> dict[str, str]:
    return {f"{HARDWARE_PREFIX}{key}": value for key, value in hardware.items()}
