"""Fast checks of the contracts between stages: the profile record, dvc.yaml deps, TensorBoard files."""

from __future__ import annotations

import ast
import dataclasses
import functools
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from pipeline.common.errors import PipelineError
from pipeline.records.profile import (
    RECORD_FORMAT,
    Combination,
    ProfileRecord,
    parse_combination,
    read_record,
    write_record,
)
from pipeline.tracking.tensorboard_events import EventWriter
from tests.helpers.records import make_record
from tests.helpers.repo import REPO_ROOT
from tests.helpers.stores import empty_store


def test_profile_record_round_trips_through_its_json(tmp_path: Path) -> None:
    record = make_record(16, "cpu", "train", 4.0, (("aten::mkldnn_convolution", 35.0), ("aten::add_", 5.0)))
    path = tmp_path / "profile.json"
    path.write_text(write_record(record))
    assert read_record(path, record.combination) == record


def test_committed_profile_records_match_the_code() -> None:
    """The workspace's profile.json files are read by the report: a renamed field must fail here first."""
    paths = sorted((REPO_ROOT / "profiles").glob("*/*/profile.json"))  # profiles/<device>/<batch>-<mode>/
    assert paths, "no committed profiles: run `dvc repro`"
    for path in paths:
        batch, mode = path.parent.name.split("-")
        combination = parse_combination([batch, path.parent.parent.name, mode])
        record = read_record(path, combination)
        assert record.timing.per_sample_ms == pytest.approx(record.timing.step_time_ms_median / combination.batch_size)


def test_format_2_records_still_read_with_their_zeros_as_no_number() -> None:
    """Records written before format 3 (the project's H100 records, older workspace profiles) stay readable:
    a 0 MFLOPs (no profiler formula) and a CPU run's 0 GPU ms become None; real numbers stay as they were."""
    folder = REPO_ROOT / "tests" / "data" / "h100-2026-11-22" / "profiles"  # <batch>-<device>-<mode>/ folders
    paths = sorted(folder.glob("*/profile.json"))
    old = [(path, raw) for path in paths if (raw := json.loads(path.read_text()))["format"] == 2]
    assert any("cuda" in path.parent.name for path, _ in old)
    for path, raw in old:
        combination = parse_combination(path.parent.name.split("-"))
        record = read_record(path, combination)
        assert record.format == 2  # how its FLOPs were counted stays visible
        for row, before in zip(record.top_operators, raw["top_operators"], strict=True):
            assert row.mflops == (before["mflops"] or None)
            on_gpu = combination.device != "cpu"
            assert row.self_device_ms == (before["self_device_ms"] if on_gpu else None)
            assert row.total_device_ms == (before["total_device_ms"] if on_gpu else None)


def test_only_optional_unions_are_record_fields(tmp_path: Path) -> None:
    record = make_record(16, "cpu", "train", 4.0, (("aten::mkldnn_convolution", 35.0),))
    raw = record.as_dict()
    raw["top_operators"][0]["mflops"] = "12.5"
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(PipelineError, match=r"OperatorRow\.mflops must be float, got str"):
        read_record(path, record.combination)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda raw: raw["timing"].pop("per_sample_ms"), "Timing.per_sample_ms is missing"),
        (lambda raw: raw["timing"].update(per_sample_seconds=1.0), "unknown field(s) ['per_sample_seconds'] in Timing"),
        (lambda raw: raw["combination"].update(batch_size="16"), "Combination.batch_size must be int, got str"),
        (lambda raw: raw["combination"].update(device="tpu"), "holds combination 16-tpu-train, not 16-cpu-train"),
        (lambda raw: raw.update(format=0), f"is not a profile record of format {RECORD_FORMAT}"),
        (lambda raw: raw["combination"].update(batch_size=64), "holds combination 64-cpu-train, not 16-cpu-train"),
    ],
)
def test_a_record_that_does_not_match_is_refused_with_the_fix(change: Any, message: str, tmp_path: Path) -> None:
    record = make_record(16, "cpu", "train", 4.0)
    raw = record.as_dict()
    change(raw)
    path = tmp_path / "profile.json"
    path.write_text(json.dumps(raw))
    with pytest.raises(PipelineError, match="rerun `dvc repro -f profile@cpu`") as error:
        read_record(path, record.combination)
    assert message in str(error.value)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["1.5", "cpu", "train"], "`profile.batch_sizes` entry '1.5' is not a whole number >= 1"),
        (["0", "cpu", "train"], "`profile.batch_sizes` entry '0'"),
        (["1", "tpu", "train"], "`profile.devices` entry 'tpu' is not one of ['cpu', 'cuda', 'mps']"),
        (["1", "cpu", "eval"], "`profile.modes` entry 'eval' is not one of ['inference', 'train']"),
        (["1", "cpu"], "expected 3 parts (batch, device, mode), got 2"),
    ],
)
def test_combination_names_are_checked_naming_the_param(arguments: list[str], message: str) -> None:
    with pytest.raises(PipelineError) as error:
        parse_combination(arguments)
    assert message in str(error.value)
    assert parse_combination(["64", "cuda", "inference"]) == Combination(64, "cuda", "inference")


def test_record_fields_are_the_record_type_fields() -> None:
    names = {field.name for field in dataclasses.fields(ProfileRecord)}
    assert set(make_record(1, "cpu", "train", 1.0).as_dict()) == names


# --- dvc.yaml deps follow the imports ------------------------------------------------------------


def pipeline_imports(path: Path) -> set[str]:
    """`pipeline.*` and `stages.*` modules a file imports at run time (TYPE_CHECKING blocks excluded)."""
    tree = ast.parse(path.read_text())
    type_only = {
        id(node)
        for block in ast.walk(tree)
        if isinstance(block, ast.If) and isinstance(block.test, ast.Name) and block.test.id == "TYPE_CHECKING"
        for statement in block.body
        for node in ast.walk(statement)
    }
    modules = set()
    for node in ast.walk(tree):
        if id(node) in type_only:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] in ("pipeline", "stages"):
            modules.add(node.module)
        elif isinstance(node, ast.Import):
            modules |= {alias.name for alias in node.names if alias.name.split(".")[0] in ("pipeline", "stages")}
    return modules


# The device registry imports every module of its folder (each kind): they are in the closure of whatever reaches it.
DEVICE_REGISTRY = "pipeline/devices/registry.py"


def import_closure(script: str) -> set[str]:
    """Source files (as dvc.yaml spells them) a stage script runs: itself and every pipeline module it reaches."""
    seen: set[str] = set()
    pending = [script]
    while pending:
        relative = pending.pop()
        if relative in seen:
            continue
        seen.add(relative)
        for module in pipeline_imports(REPO_ROOT / relative):
            pending.append(module.replace(".", "/") + ".py")
        pending.extend(_package_inits_with_code(relative))
        if relative == DEVICE_REGISTRY:
            pending.extend(str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / "pipeline/devices").glob("*.py"))
    return seen - {str(path) for path in _empty_inits()}


def _empty_inits() -> list[Path]:
    return [path.relative_to(REPO_ROOT) for path in (REPO_ROOT / "pipeline").rglob("__init__.py")]


def _package_inits_with_code(relative: str) -> list[str]:
    """The `__init__.py` files Python runs before `relative` that do more than hold a docstring
    (stages/__init__.py installs the signal handlers before a stage's imports)."""
    inits = []
    for package in Path(relative).parents:
        init = REPO_ROOT / package / "__init__.py"
        if str(package) != "." and init.is_file():
            body = ast.parse(init.read_text()).body
            if not (len(body) == 1 and isinstance(body[0], ast.Expr)):
                inits.append(f"{package}/__init__.py")
    return inits


@functools.cache  # the files do not change during a test run; parsing every closure once per stage cost seconds
def stage_code_deps() -> dict[str, tuple[set[str], set[str]]]:
    """Per stage: (its declared code deps under pipeline/ and stages/, the import closure of its script). Data files
    the code reads (the report's message catalogues) are checked apart: test_data_deps_are_read_by_the_stage_code."""
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    result = {}
    for name, definition in stages.items():
        stage = definition.get("do", definition)  # a `foreach` stage's body is under `do`
        module = stage["cmd"].split()[2]  # python -m stages.<name> ...
        code = [dep for dep in stage["deps"] if isinstance(dep, str) and dep.startswith(("pipeline/", "stages/"))]
        declared = {dep for dep in code if dep.endswith(".py")}
        for folder in (dep for dep in code if _is_code_folder(dep)):  # a folder of modules: each of them
            declared |= {str(path.relative_to(REPO_ROOT)) for path in (REPO_ROOT / folder).glob("*.py")} - {
                f"{folder}/__init__.py"  # holds only a docstring (test_every_package_init_holds_only_a_docstring)
            }
        result[name] = (declared, import_closure(module.replace(".", "/") + ".py"))
    return result


@pytest.mark.parametrize("stage", sorted(yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]))
def test_dvc_yaml_code_deps_are_exactly_the_stage_import_closure(stage: str) -> None:
    declared, closure = stage_code_deps()[stage]
    assert not closure - declared, f"dvc.yaml stage {stage!r} lacks deps {sorted(closure - declared)}"
    assert not declared - closure, (
        f"dvc.yaml stage {stage!r} declares deps it never imports {sorted(declared - closure)}"
    )


def _is_code_folder(dep: str) -> bool:
    return (REPO_ROOT / dep).is_dir() and any((REPO_ROOT / dep).glob("*.py"))


def test_data_deps_are_read_by_the_stage_code() -> None:
    """A file or folder of data under pipeline/ that a stage depends on is named by a module the stage imports (and
    the message catalogues, which the report reads, are such a dep)."""
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    data_deps = {}
    for name, definition in stages.items():
        stage = definition.get("do", definition)
        for dep in stage["deps"]:
            if (
                isinstance(dep, str)
                and dep.startswith("pipeline/")
                and not dep.endswith(".py")
                and not _is_code_folder(dep)
            ):
                closure = stage_code_deps()[name][1]
                readers = [path for path in closure if f'"{Path(dep).name}"' in (REPO_ROOT / path).read_text()]
                assert (REPO_ROOT / dep).exists() and readers, (name, dep)
                data_deps[name, dep] = readers
    assert data_deps[("report", "pipeline/report/messages")] == ["pipeline/report/catalogue.py"]


def test_the_closure_follows_imports_through_modules() -> None:
    closure = import_closure("stages/train.py")
    assert "pipeline/common/machine.py" in closure  # reached only through pipeline/training/runtime.py
    assert "pipeline/tracking/tracker.py" in closure and "stages/train.py" in closure
    assert "stages/__init__.py" in closure and "pipeline/common/interrupts.py" in closure  # run before any import


# --- TensorBoard files written without torch ------------------------------------------------------


def test_event_writer_scalars_and_text_read_back_with_tensorboard(tmp_path: Path) -> None:
    writer = EventWriter(tmp_path / "run")
    for step, value in enumerate((0.5, 0.25, 0.125)):
        writer.add_scalar("train/loss", value, step)
    writer.add_text("report/markdown", "| a | b |\n| - | - |\n| 1 | 2 |")
    writer.close()
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert [(s.step, s.value) for s in events.Scalars("train/loss")] == [(0, 0.5), (1, 0.25), (2, 0.125)]
    (text,) = events.Tensors("report/markdown/text_summary")
    assert text.tensor_proto.string_val[0].decode() == "| a | b |\n| - | - |\n| 1 | 2 |"
    assert events.summary_metadata["report/markdown/text_summary"].plugin_data.plugin_name == "text"


def test_event_writer_frames_records_as_tensorboard_does_and_flush_shows_them_before_close(tmp_path: Path) -> None:
    """The writer checksums records itself (google-crc32c, in C): every length and event checksum must equal
    TensorBoard's own pure-Python masked CRC32C, and a flushed file must read back while still open."""
    from tensorboard.compat.tensorflow_stub.pywrap_tensorflow import masked_crc32c

    writer = EventWriter(tmp_path / "run")
    for step in range(50):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
    writer.flush()
    events = EventAccumulator(str(tmp_path / "run"))
    events.Reload()
    assert len(events.Scalars("train/loss")) == 50  # visible before close: TensorBoard follows a training live
    writer.add_png("data/grid", _tiny_png())
    writer.close()
    (path,) = (tmp_path / "run").glob("events.out.tfevents.*")
    data, records = path.read_bytes(), 0
    while data:
        length = int.from_bytes(data[:8], "little")
        assert int.from_bytes(data[8:12], "little") == masked_crc32c(data[:8])
        assert int.from_bytes(data[12 + length : 16 + length], "little") == masked_crc32c(data[12 : 12 + length])
        data, records = data[16 + length :], records + 1
    assert records == 1 + 50 + 1  # the file-version event, the scalars, the image


def _tiny_png() -> bytes:
    import io

    from PIL import Image

    buffer = io.BytesIO()
    Image.new("L", (3, 2), 128).save(buffer, format="PNG")
    return buffer.getvalue()


# --- one dvc repro is one tree of runs in MLflow ----------------------------------------------------


@pytest.mark.slow  # stage runs logged to an MLflow store in process: seconds
def test_stage_runs_of_one_pipeline_run_share_a_parent_and_the_latest_is_current(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    from pipeline.params.schema import TrackingConfig
    from pipeline.tracking.lifecycle import open_tracker

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    (tmp_path / "params.yaml").write_text("train: {lr: 1.0}\n")
    empty_store(tmp_path)
    config = TrackingConfig(experiment="lineage", tensorboard_dir="runs", registered_model="lab-model")
    run_ids = []
    for stage in ("train", "report", "report"):
        with open_tracker(stage, config, root=tmp_path) as tracker:
            run_ids.append(tracker.run_id)
    (tmp_path / "params.yaml").write_text("train: {lr: 0.5}\n")  # an edit: a new pipeline run
    with open_tracker("train", config, root=tmp_path) as tracker:
        run_ids.append(tracker.run_id)

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    runs = {run_id: client.get_run(run_id) for run_id in run_ids}
    parents = [runs[run_id].data.tags["mlflow.parentRunId"] for run_id in run_ids]
    assert parents[0] == parents[1] == parents[2] != parents[3]
    parent = client.get_run(parents[0])
    assert parent.info.run_name.startswith("pipeline@") and parent.info.status == "FINISHED"
    assert parent.data.tags["pipeline.commit"] == "none"  # tmp_path is no git repository
    # Its duration in the UI is the pipeline's: from before its first stage started to when its last one ended.
    children = [runs[run_id].info for run_id in run_ids[:3]]
    assert parent.info.start_time <= children[0].start_time and parent.info.end_time == children[2].end_time
    outputs = [client.get_run(run_id).data.tags["dvc.outputs"] for run_id in run_ids]
    assert outputs == ["superseded", "superseded", "current", "current"]  # train rerun after the edit supersedes
    assert "Train the lab CNN" in runs[run_ids[0]].data.tags["mlflow.note.content"]
    experiment = client.get_experiment_by_name("lineage")
    assert "one run per DVC stage" in experiment.tags["mlflow.note.content"]


def test_a_stage_finds_the_runs_behind_the_bytes_it_read_whichever_dvc_experiment_wrote_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A `dvc exp run` reruns only what changed: the report it makes reads the baseline's train outputs and its own
    profile outputs, and links to both producers. Each stage name has one current run per workspace folder; a queued
    experiment's copy (under .dvc/tmp/exps) is a workspace of its own."""
    from mlflow import MlflowClient

    from pipeline.common.outputs import AtomicOutputs
    from pipeline.params.schema import TrackingConfig
    from pipeline.tracking.lifecycle import open_tracker
    from pipeline.tracking.lineage import file_md5

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("DVC_EXP_NAME", raising=False)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "params.yaml").write_text("train: {lr: 1.0}\n")
    empty_store(tmp_path)
    config = TrackingConfig(experiment="lineage", tensorboard_dir="runs", registered_model="lab-model")
    speed, record = Path("metrics/train_speed.json"), Path("profiles/1-cpu-train/profile.json")

    def stage(name: str, writes: dict[Path, str], reads: dict[str, Path] | None = None) -> str:
        with open_tracker(name, config, root=tmp_path) as tracker, AtomicOutputs() as outputs:
            for path, text in writes.items():
                outputs.write_text(path, text)
            if reads is not None:
                outputs.commit()  # what it read is in place: a report reads files other stages committed
                tracker.link_inputs(reads, "a report")
            return tracker.run_id

    baseline_train = stage("train", {speed: '{"samples_per_s": 100}', Path("models/model.pt"): "weights"})
    stage("profile@1-cpu-train", {record: '{"median_ms": 2.0}'})
    reads = {"train": speed, "profile@1-cpu-train": record}
    baseline_report = stage("report", {}, reads)

    monkeypatch.setenv("DVC_EXP_NAME", "brisk-lark")  # `dvc exp run -S profile...`: profile and report rerun
    experiment_profile = stage("profile@1-cpu-train", {record: '{"median_ms": 2.5}'})
    experiment_report = stage("report", {}, reads)

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    tags = client.get_run(experiment_report).data.tags
    assert tags["input.train"] == baseline_train  # written by the baseline's `dvc repro`, read by the experiment
    assert tags["input.profile.1-cpu-train"] == experiment_profile
    assert "Not in this store" not in tags["mlflow.note.content"]
    recorded = json.loads(client.get_run(baseline_train).data.tags["dvc.outs.md5"])
    assert recorded == {str(speed): file_md5(speed), "models/model.pt": file_md5(Path("models/model.pt"))}

    def current(name: str) -> list[str]:
        runs = client.search_runs(
            [client.get_experiment_by_name("lineage").experiment_id],
            filter_string=f"attributes.run_name = '{name}' and tags.`dvc.outputs` = 'current'",
        )
        return [run.info.run_id for run in runs]

    assert current("report") == [experiment_report] and current("train") == [baseline_train]
    assert client.get_run(baseline_report).data.tags["dvc.outputs"] == "superseded"

    # Bytes no run of this store wrote (pulled from a remote another store tracked): named, not linked.
    speed.write_text('{"samples_per_s": 90}')
    other_report = stage("report", {}, reads)
    tags = client.get_run(other_report).data.tags
    assert "input.train" not in tags and tags["input.profile.1-cpu-train"] == experiment_profile
    assert tags["mlflow.note.content"].endswith("Not in this store (outputs from a DVC remote or cache): train.")

    # A queued experiment's copy is its own workspace: its runs leave the project's current ones current.
    copy = tmp_path / ".dvc" / "tmp" / "exps" / "tmpq1"
    copy.mkdir(parents=True)
    monkeypatch.chdir(copy)
    with open_tracker("report", config) as tracker:
        queued_report = tracker.run_id
    assert sorted(current("report")) == sorted([other_report, queued_report])
    assert client.get_run(queued_report).data.tags["dvc.workspace"] == str(copy.resolve())


# --- the wings: package faces stay empty, import rules hold and bite ---------------------------------


def test_every_package_init_holds_only_a_docstring() -> None:
    """Importing one module of a wing runs its __init__.py: kept empty, it imports nothing (the torch-free
    stages rely on it) and need not be a dvc.yaml dep."""
    inits = sorted((REPO_ROOT / "pipeline").rglob("__init__.py"))
    assert len(inits) >= 10
    for init in inits:
        body = ast.parse(init.read_text()).body
        assert len(body) == 1 and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant), init


@pytest.mark.parametrize(
    ("module", "line", "contract"),
    [
        ("pipeline/common/errors.py", "import pipeline.tracking.tags", "stages -> wings -> tracking/params -> common"),
        ("pipeline/report/figures.py", "import torch", "no torch in the torch-free stages"),
    ],
)
def test_import_rules_fail_when_broken(tmp_path: Path, module: str, line: str, contract: str) -> None:
    """`make check` runs lint-imports: a copy of the code with one forbidden import must break the named contract."""
    for name in ("pipeline", "stages", "benchmarks"):
        shutil.copytree(REPO_ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path)
    lint = [str(Path(sys.executable).parent / "lint-imports")]
    kept = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300)
    assert kept.returncode == 0, kept.stdout + kept.stderr
    target = tmp_path / module
    target.write_text(target.read_text() + f"\n{line}\n")
    broken = subprocess.run(lint, cwd=tmp_path, capture_output=True, text=True, check=False, timeout=300)
    assert broken.returncode == 1, broken.stdout + broken.stderr
    assert f"{contract} BROKEN" in broken.stdout


def test_the_default_retry_budget_rides_out_a_minute_as_the_readme_says() -> None:
    """The retry budget a stage gives the tracking server (store.HTTP_CLIENT_DEFAULTS), computed with the retry
    object MLflow's own HTTP session builds from it: the sleeps the README states, and at least a minute of outage
    ridden out. The stress suite's outage tests run with a smaller budget to save minutes; this is their link to
    the real one."""
    import urllib3
    from mlflow.utils.request_utils import _get_request_session

    from pipeline.tracking.store import HTTP_CLIENT_DEFAULTS

    retries = int(HTTP_CLIENT_DEFAULTS["MLFLOW_HTTP_REQUEST_MAX_RETRIES"])
    factor = float(HTTP_CLIENT_DEFAULTS["MLFLOW_HTTP_REQUEST_BACKOFF_FACTOR"])
    session = _get_request_session(retries, factor, 0.0, (500, 502, 503, 504), True, True)
    retry = session.get_adapter("http://127.0.0.1/").max_retries
    sleeps = []
    for _ in range(retries):
        retry = retry.increment(method="POST", url="/", error=urllib3.exceptions.ConnectTimeoutError())
        sleeps.append(retry.get_backoff_time())
    with pytest.raises(urllib3.exceptions.MaxRetryError):
        retry.increment(method="POST", url="/", error=urllib3.exceptions.ConnectTimeoutError())
    assert sleeps == [0, 2, 4, 8, 16, 32]
    assert sum(sleeps) >= 60  # a refused connection costs nothing: the sleeps alone ride out a minute
    readme = " ".join((REPO_ROOT / "README.md").read_text().split())
    timeout = HTTP_CLIENT_DEFAULTS["MLFLOW_HTTP_REQUEST_TIMEOUT"]
    assert f"each request waits {timeout} s and is retried {retries} times, after 0, 2, 4, 8, 16 and 32 s" in readme


@pytest.mark.parametrize(
    ("cause", "how"),
    [
        ("ResponseError('too many 500 error responses')", "HTTP 500"),
        (
            "ProtocolError('Connection aborted.', RemoteDisconnected('Remote end closed connection without response'))",
            "the connection closed during the upload",
        ),
    ],
)
def test_a_failed_artifact_upload_names_the_servers_storage_however_the_client_saw_it(cause: str, how: str) -> None:
    """The two ways a client saw the class server's full artifact folder in tests/test_class_server_stress.py
    (which of them depends on when the server gave up reading the upload); a store that is down gets the other
    hint."""
    from pipeline.tracking.lifecycle import _failure_hint

    url = "/api/2.0/mlflow-artifacts/artifacts/1/0123/artifacts/model/data/model.pt2"
    message = (
        f"API request to http://127.0.0.1:5000{url} failed with exception HTTPConnectionPool(host='127.0.0.1', "
        f"port=5000): Max retries exceeded with url: {url} (Caused by {cause})"
    )
    hint = _failure_hint(message)
    assert hint.startswith(f"The server failed to store an artifact ({how}, on every retry)") and "full" in hint
    down = message.replace("mlflow-artifacts/artifacts/1/0123/artifacts/model/data/model.pt2", "mlflow/runs/log-batch")
    assert _failure_hint(down).startswith("Check that the store is up")
