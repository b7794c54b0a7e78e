"""The columns of TensorBoard's HParams table for a whole log directory (`tensorboard --logdir runs`).

TensorBoard's HParams plugin takes its columns from the first experiment summary it meets in the log directory,
or, with none, from every hparam and every scalar tag of every run. So each stage run writes only its session
(its hparams and, as scalars, its `hparam/*` results: pipeline.tracking.tensorboard_events.hparams_session), and
one experiment summary in `<tensorboard_dir>/hparams/` names the columns of all of them: the train run's settings
as they ran (`train.lr`, `train.epochs`, ... and `train.<key>_requested` where params.yaml said `auto`), the
profile runs' combination (`profile.batch_size`, `profile.device`, `profile.mode`), and the results of both.
With `--logdir runs/train` (no experiment summary there) TensorBoard builds the columns from that run alone.
"""

from __future__ import annotations

import dataclasses
import hashlib
import typing
from pathlib import Path

from pipeline.params.schema import RESOLVED_TRAIN_KEYS, TrainConfig
from pipeline.tracking.tensorboard_events import EventWriter, hparams_experiment, scalars_layout

FOLDER = "hparams"  # under the TensorBoard directory: a run of its own holding only the experiment summary
TRAIN_RESULTS = ("hparam/test_accuracy", "hparam/test_loss", "hparam/images_per_second")
PROFILE_COMBINATION = {"profile.batch_size": int, "profile.device": str, "profile.mode": str}
PROFILE_RESULTS = ("hparam/step_time_ms_median", "hparam/per_sample_ms", "hparam/throughput_samples_per_s")
# The columns the table shows before any is ticked (TensorBoard shows five): what a lab's experiments vary.
SHOWN = ("profile.batch_size", "profile.device", "profile.mode", "train.epochs", "train.lr")


def _python_type(annotation: object) -> type | None:
    """int, float, str or bool for a scalar field (a Literal of strings is str); None for anything else."""
    if typing.get_origin(annotation) is typing.Literal:
        return type(typing.get_args(annotation)[0])
    return annotation if annotation in (int, float, str, bool) else None


def _scalar_columns(section: type, prefix: str) -> dict[str, type]:
    """`<prefix><field>` for every scalar field of a params section, nested sections flattened with dots."""
    hints = typing.get_type_hints(section)
    found: dict[str, type] = {}
    for field in dataclasses.fields(section):
        hint = hints[field.name]
        if dataclasses.is_dataclass(hint):
            found.update(_scalar_columns(hint, f"{prefix}{field.name}."))  # type: ignore[arg-type]
        elif (kind := _python_type(hint)) is not None:
            found[f"{prefix}{field.name}"] = kind
    return found


def train_columns() -> dict[str, type]:
    """`train.<field>` for every setting of the train section as the train run logs them (the model's widths as
    `train.model.<field>`), and `train.<key>_requested` for the settings it resolves."""
    found = _scalar_columns(TrainConfig, "train.")
    found.update({f"train.{key}_requested": found[f"train.{key}"] for key in RESOLVED_TRAIN_KEYS})
    return found


def columns() -> tuple[dict[str, type], tuple[str, ...]]:
    """The HParams table's hparam columns (name -> type) and metric columns (scalar tags)."""
    return {**train_columns(), **PROFILE_COMBINATION}, TRAIN_RESULTS + PROFILE_RESULTS


# Custom Scalars: train and test curves of each train run on one set of axes (both on the optimizer-step axis).
OVERLAYS = {
    "loss: train (per logged window) and test (per epoch)": (r"^train/loss$", r"^test/loss$"),
    "accuracy: train (per logged window) and test (per epoch)": (r"^train/accuracy$", r"^test/accuracy$"),
}


def write_experiment(tensorboard_dir: Path) -> None:
    """The experiment summary and the Custom Scalars layout (OVERLAYS) in `<tensorboard_dir>/hparams/`, written
    once: a file named by the digest of its content stays as long as they do; a file of other content (older code)
    is replaced."""
    hparams, metrics = columns()
    summaries = [hparams_experiment(hparams, metrics, SHOWN), scalars_layout("training", OVERLAYS)]
    digest = hashlib.sha256(b"".join(summary.SerializeToString() for summary in summaries)).hexdigest()[:12]
    folder = tensorboard_dir / FOLDER
    existing = list(folder.glob("events.out.tfevents.*")) if folder.is_dir() else []
    if any(path.name.endswith(f".hparams-{digest}") for path in existing):
        return
    writer = EventWriter(folder, suffix=f"hparams-{digest}")
    try:
        for summary in summaries:
            writer.add_summary(summary)
    finally:
        writer.close()
    for path in existing:
        path.unlink(missing_ok=True)
