"""Tie one `dvc repro` together in MLflow: a parent run per pipeline run, links, and which run is current.

DVC runs every stage as its own process and gives them no shared id, so the pipeline run is
identified by what makes it one: the git commit, the bytes of params.yaml and dvc.yaml, the DVC
experiment name when there is one, and the machine (`machine.id`: on a shared tracking server, two
machines running the same commit are two pipeline runs). Stages that share that key are children of
one parent run (`pipeline@<commit>-<params digest>`), which MLflow's UI shows as a tree. A forced
rerun with the same key joins the same parent; a params edit or a new commit starts a new one.

Which run wrote a file is a matter of content, not of names: every stage run records the md5 of each
output it puts in place (`dvc.outs.md5`, the same digest `dvc.lock` records for it), and a stage that
reads a file finds its producer by that digest (`producer_run`). So the report run links to the runs
behind the very bytes it read, whichever `dvc repro` or DVC experiment made them: a `dvc exp run` that
reruns only some stages reads the rest from the baseline's runs, and links to those.

Reruns leave older runs of a stage behind; `mark_current` tags the run that produced the outputs now
in its workspace `dvc.outputs = current` and its predecessors (same stage, machine and workspace
folder: a `dvc exp run` in the workspace replaces the baseline's outputs there, a queued experiment
writes its own copy under `.dvc/tmp/exps`) `superseded`, so a search for
`tags."dvc.outputs" = 'current'` lists the runs behind the files on disk, one per stage.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.tracking.tags import COMMIT_TAG, ID_TAG, NOTE_TAG, PARAMS_DIGEST_TAG, STAGE_TAG

if TYPE_CHECKING:
    from mlflow import MlflowClient
    from mlflow.entities import Run
from pipeline.tracking.tags import KEY_TAG, OUTPUTS_MD5_TAG, OUTPUTS_TAG, WORKSPACE_TAG

PIPELINE_FILES = ("params.yaml", "dvc.yaml")


@dataclass(frozen=True)
class PipelineRun:
    key: str
    commit: str  # "none" outside a git repository
    params_digest: str  # sha256 of params.yaml + dvc.yaml, first 12 hex digits
    experiment: str  # DVC experiment name, "" for a plain `dvc repro`
    machine: dict[str, str] = field(default_factory=dict)  # the machine.* tags of the machine it runs on

    @property
    def name(self) -> str:
        suffix = f"-{self.experiment}" if self.experiment else ""
        return f"pipeline@{self.commit[:8]}-{self.params_digest[:6]}{suffix}"

    def tags(self) -> dict[str, str]:
        return {
            KEY_TAG: self.key,
            COMMIT_TAG: self.commit,
            PARAMS_DIGEST_TAG: self.params_digest,
            **self.machine,
        }


def current_pipeline_run(root: Path, machine: Mapping[str, str] | None = None) -> PipelineRun:
    digest = hashlib.sha256()
    for name in PIPELINE_FILES:
        path = root / name
        digest.update(name.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"") + b"\0")
    params_digest = digest.hexdigest()[:12]
    commit = _git_commit(root)
    experiment = os.environ.get("DVC_EXP_NAME", "")
    machine = dict(machine or {})
    identity = f"{commit}\0{params_digest}\0{experiment}\0{machine.get(ID_TAG, '')}"
    key = hashlib.sha256(identity.encode()).hexdigest()[:16]
    return PipelineRun(key=key, commit=commit, params_digest=params_digest, experiment=experiment, machine=machine)


def _git_commit(root: Path) -> str:
    try:
        result = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "none"
    return result.stdout.strip() if result.returncode == 0 else "none"


def parent_run_id(
    client: MlflowClient, experiment_id: str, pipeline: PipelineRun, experiment_tags: Mapping[str, str] | None = None
) -> str:
    """The parent run of this pipeline run: found by its key, or created (and ended at once: it holds
    no work of its own, only children, so it never sits RUNNING in the UI; `reflect_children` keeps its status
    that of its children). `experiment_tags` (the DVC experiment and its baseline, inside `dvc exp run`) go on
    it as on its children, so a search by experiment finds the whole tree."""
    query = f"tags.`{KEY_TAG}` = '{pipeline.key}' and tags.stage = 'pipeline'"  # its children carry the key too
    found = client.search_runs([experiment_id], filter_string=query, max_results=1)
    if found:
        for tag, value in (experiment_tags or {}).items():
            if found[0].data.tags.get(tag) != value:
                client.set_tag(found[0].info.run_id, tag, value)
        return str(found[0].info.run_id)
    description = (
        f"One `dvc repro` of commit {pipeline.commit[:12]} with params digest {pipeline.params_digest}"
        + (f" (DVC experiment {pipeline.experiment})" if pipeline.experiment else "")
        + ": its stage runs are the children below."
    )
    tags = {**pipeline.tags(), **(experiment_tags or {}), STAGE_TAG: "pipeline", NOTE_TAG: description}
    run = client.create_run(experiment_id, run_name=pipeline.name, tags=tags)
    client.set_terminated(run.info.run_id, "FINISHED")
    return str(run.info.run_id)


# The worst status first: what a parent shows when its children's latest runs differ.
_STATUS_ORDER = ("FAILED", "KILLED", "RUNNING", "SCHEDULED", "FINISHED")
PARENT_RUN_TAG = "mlflow.parentRunId"  # MLflow's own tag of a child run


def reflect_children(client: MlflowClient, experiment_id: str, parent_id: str) -> str:
    """Set the parent run's status to its children's: the newest run of each stage (by run name: a forced rerun
    replaces an earlier failure of the same stage), FAILED if any is, else KILLED if any is, else FINISHED.
    Returns the status set. A parent of a `dvc repro` that stopped at a failure or a Ctrl-C no longer reads
    FINISHED in the MLflow UI; one whose failed stage was rerun successfully reads FINISHED again. Its end time is
    its last child's, so the UI gives the pipeline's duration (from its first stage's start) instead of the few
    milliseconds the parent itself took."""
    children = client.search_runs(
        [experiment_id],
        filter_string=f"tags.`{PARENT_RUN_TAG}` = '{parent_id}'",
        order_by=["attributes.start_time DESC"],
        max_results=5000,
    )
    newest: dict[str, str] = {}
    for child in children:
        newest.setdefault(child.info.run_name or child.info.run_id, child.info.status)
    finished = [status for status in newest.values() if status != "RUNNING"]  # a stage still at work: not yet
    status = min(finished, key=_STATUS_ORDER.index, default="FINISHED")
    status = status if status in ("FAILED", "KILLED") else "FINISHED"
    end_time = max((child.info.end_time or 0 for child in children), default=0) or None
    parent = client.get_run(parent_id).info
    if parent.status != status or (end_time is not None and parent.end_time != end_time):
        client.set_terminated(parent_id, status, end_time=end_time)
    return status


def mark_current(
    client: MlflowClient,
    experiment_id: str,
    run_id: str,
    stage_run_name: str,
    machine_id: str = "",
    workspace: str = "",
) -> None:
    """Tag `run_id` as the producer of the workspace's outputs of `stage_run_name`, older ones of the same
    machine (`machine_id`) and workspace folder (`workspace`) superseded; runs without either tag count as this
    machine's and workspace's."""
    for run in _current_runs(client, experiment_id, stage_run_name, machine_id, workspace):
        if run.info.run_id != run_id:
            client.set_tag(run.info.run_id, OUTPUTS_TAG, "superseded")
    client.set_tag(run_id, OUTPUTS_TAG, "current")


def _current_runs(
    client: MlflowClient, experiment_id: str, stage_run_name: str, machine_id: str, workspace: str
) -> list[Run]:
    """Runs of `stage_run_name` tagged current, newest first, of this machine and workspace folder."""
    query = f"attributes.run_name = '{stage_run_name}' and tags.`{OUTPUTS_TAG}` = 'current'"
    runs = client.search_runs(
        [experiment_id], filter_string=query, order_by=["attributes.start_time DESC"], max_results=1000
    )
    return [
        run
        for run in runs
        if run.data.tags.get(ID_TAG, machine_id) == machine_id
        and run.data.tags.get(WORKSPACE_TAG, workspace) == workspace
    ]


def outputs_md5(staged: Mapping[Path, Path], root: Path) -> str:
    """The `dvc.outs.md5` tag of a run that is about to put `staged` ({final path: staged file}) in place:
    compact JSON {path relative to `root`: md5 of the bytes}, the digest `dvc.lock` records for a file output."""
    digests = {_relative(final, root): file_md5(staged_file) for final, staged_file in staged.items()}
    return json.dumps(digests, sort_keys=True, separators=(",", ":"))


def file_md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _relative(path: Path, root: Path) -> str:
    path = Path(path)
    if path.is_absolute() and path.is_relative_to(root):
        path = path.relative_to(root)
    return path.as_posix()


def producer_run(
    client: MlflowClient, experiment_id: str, stage_run_name: str, path: Path, root: Path, workspace: str = ""
) -> Run | None:
    """The FINISHED run of `stage_run_name` that put the bytes now at `path` in place (its `dvc.outs.md5` names
    the file with this md5), or None when this store holds none (outputs pulled from a DVC remote another store
    tracked, or written before runs recorded their outputs). `path` is as the caller opened it (relative to the
    working folder, or absolute). A file several runs wrote alike (a checkpoint is bit-identical on one CPU)
    names the one current in `workspace` if it is among them, else the newest."""
    entry = json.dumps({_relative(path, root): file_md5(path)}, separators=(",", ":"))[1:-1]
    query = (
        f"attributes.run_name = '{stage_run_name}' and attributes.status = 'FINISHED' "
        f"and tags.`{OUTPUTS_MD5_TAG}` LIKE '%{entry}%'"
    )
    runs = client.search_runs(
        [experiment_id], filter_string=query, order_by=["attributes.start_time DESC"], max_results=100
    )
    current = [
        run
        for run in runs
        if run.data.tags.get(OUTPUTS_TAG) == "current" and run.data.tags.get(WORKSPACE_TAG, workspace) == workspace
    ]
    found = current or runs
    return found[0] if found else None


def training_run(client: MlflowClient, experiment_id: str, model_digest: str) -> Run | None:
    """The FINISHED train run that wrote the checkpoint with this digest: the one whose outputs are current if
    several did (training is bit-identical on one machine), else the latest; None if this store has none."""
    query = f"tags.stage = 'train' and tags.`model.digest` = '{model_digest}' and attributes.status = 'FINISHED'"
    runs = client.search_runs(
        [experiment_id], filter_string=query, order_by=["attributes.start_time DESC"], max_results=100
    )
    current = [run for run in runs if run.data.tags.get(OUTPUTS_TAG) == "current"]
    if current:
        return current[0]
    return runs[0] if runs else None
