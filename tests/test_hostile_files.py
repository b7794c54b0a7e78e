"""Bad files and environments: secrets, damaged data, checkpoints and stores,
full or read-only disks, a rename that fails halfway, what killed runs leave behind.

Each case runs the way a stage runs it (pipeline.common.stage_runner.run_stage): exit code 2, one paragraph naming the
file and the fix, no traceback. Full and read-only file systems are real: tmpfs and read-only bind
mounts inside `unshare -rm` (a user and mount namespace: no root needed where the kernel allows it).
"""

from __future__ import annotations

import base64
import functools
import gzip
import http.server
import json
import os
import random
import shutil
import subprocess
import sys
import threading
import tracemalloc
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar

import pytest
import torch
from mlflow import MlflowClient

from pipeline.common.credentials import redact, split_user_info
from pipeline.common.errors import PipelineError
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.stage_runner import prepare_output_folders, run_stage, sweep_killed_runs
from pipeline.data.mnist import MNIST_BYTES, MNIST_SHA256, fetch_mnist, load_split, write_dataset
from pipeline.graph.export import check_onnx
from pipeline.model.checkpoint import (
    DIGEST_KEY,
    checkpoint_payload,
    load_checkpoint,
    payload_digest,
    save_checkpoint,
)
from pipeline.model.network import LabNet
from pipeline.params.parsing import params_from_mapping
from pipeline.params.schema import DataConfig, TrackingConfig
from pipeline.profiling.processes import ask, worker_server
from pipeline.profiling.worker import WorkerSpec
from pipeline.tracking.lifecycle import open_tracker
from pipeline.tracking.store import check_tracking_server, credentials_out_of_uri
from tests.helpers.data import LAB_MODEL, make_synthetic_mnist
from tests.helpers.projects import clone_project, copy_project, run_command, stage_environment
from tests.helpers.repo import REPO_ROOT
from tests.helpers.servers import closed_port
from tests.helpers.stores import empty_store

TRAIN_IMAGES = "train-images-idx3-ubyte"


def _stage_exit(main: Callable[[], object], capsys: pytest.CaptureFixture[str], name: str = "probe") -> tuple[int, str]:
    """Run `main` as a stage script does; return the exit code and what it printed on stderr."""

    def stage() -> None:
        main()

    with pytest.raises(SystemExit) as exited:
        run_stage(name, stage)
    return int(exited.value.code or 0), capsys.readouterr().err


def _assert_user_error(code: int, stderr: str, *expected: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr
    for text in expected:
        assert text in stderr, stderr


@pytest.fixture
def data_config(repo_params: dict[str, Any]) -> DataConfig:
    return replace(params_from_mapping(repo_params).data, retries=0, timeout_s=5)


# ---------------------------------------------------------------- point 2: secrets


def test_redact_masks_user_info_of_every_url_and_nothing_else() -> None:
    text = (
        "tried https://alice:s3cr%40t@example.org/mnist/ and http://tok@h:5000/x, mail me@example.org at https://h/p@q"
    )
    assert (
        redact(text)
        == "tried https://***@example.org/mnist/ and http://***@h:5000/x, mail me@example.org at https://h/p@q"
    )
    assert redact("postgresql://user:pw@db/mlflow") == "postgresql://***@db/mlflow"
    assert split_user_info("http://us%40er:p%3Aw@127.0.0.1:5000/x") == ("http://127.0.0.1:5000/x", "us@er", "p:w")


class _AuthMirror(http.server.SimpleHTTPRequestHandler):
    """The offline mirror behind HTTP basic auth (user `alice`, password `hunter2`); /health for MLflow."""

    expected = "Basic " + base64.b64encode(b"alice:hunter2").decode()
    seen: ClassVar[list[str | None]] = []

    def do_GET(self) -> None:
        type(self).seen.append(self.headers.get("Authorization"))
        if self.headers.get("Authorization") != self.expected:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="mnist"')
            self.end_headers()
            return
        if self.path == "/health":
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"OK")
            return
        super().do_GET()

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture
def auth_server(mnist_mirror: Path) -> Iterator[str]:
    _AuthMirror.seen = []
    server = http.server.ThreadingHTTPServer(
        ("127.0.0.1", 0), functools.partial(_AuthMirror, directory=str(mnist_mirror))
    )
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_mirror_credentials_come_from_netrc_and_never_show(
    auth_server: str, data_config: DataConfig, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    mirror = f"http://{auth_server}/"
    netrc = tmp_path / "netrc"
    monkeypatch.setenv("NETRC", str(netrc))
    with pytest.raises(PipelineError) as caught:
        fetch_mnist(data_config, [mirror])
    assert "HTTP 401" in str(caught.value)
    assert "no credentials for it in ~/.netrc: add `machine 127.0.0.1" in str(caught.value)
    netrc.write_text("machine 127.0.0.1 login alice password hunter2\n")
    result = fetch_mnist(data_config, [mirror])
    assert {f.name: f.sha256 for f in result.files} == dict(MNIST_SHA256)
    assert _AuthMirror.seen[-1] == _AuthMirror.expected
    assert "hunter2" not in json.dumps([f.source for f in result.files])


def test_tracking_uri_password_becomes_basic_auth_and_is_never_printed(
    auth_server: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    for variable in ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(variable, raising=False)
    environ: dict[str, str] = {}
    assert credentials_out_of_uri(f"http://alice:hunter2@{auth_server}", environ) == f"http://{auth_server}"
    assert environ == {"MLFLOW_TRACKING_USERNAME": "alice", "MLFLOW_TRACKING_PASSWORD": "hunter2"}
    check_tracking_server(f"http://alice:hunter2@{auth_server}")  # the health check passes: basic auth sent
    assert _AuthMirror.seen[-1] == _AuthMirror.expected
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", "wrong-one")  # explicit variables win, as in MLflow
    code, stderr = _stage_exit(lambda: check_tracking_server(f"http://alice:hunter2@{auth_server}"), capsys)
    _assert_user_error(
        code, stderr, f"MLflow tracking server http://{auth_server} answered HTTP 401", "MLFLOW_TRACKING_PASSWORD"
    )
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD")
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME")
    dead = f"http://bob:hunter2@127.0.0.1:{closed_port()}"
    code, stderr = _stage_exit(lambda: check_tracking_server(dead), capsys)
    _assert_user_error(code, stderr, "is unreachable")
    assert "hunter2" not in stderr


def test_logged_params_never_hold_a_password(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    empty_store(tmp_path)
    with open_tracker(
        "probe",
        TrackingConfig(experiment="secrets", tensorboard_dir="runs", registered_model="lab-model"),
        root=tmp_path,
    ) as tracker:
        tracker.log_params({"data.mirrors": ["https://alice:hunter2@example.org/mnist/"]})
        run_id = tracker.run_id
    run = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}").get_run(run_id)
    assert run.data.params["data.mirrors"] == "['https://***@example.org/mnist/']"


# ---------------------------------------------------------------- point 5: data in the workspace


@pytest.fixture
def synthetic_root(data_config: DataConfig, tmp_path: Path) -> Path:
    digests = make_synthetic_mnist(tmp_path / "mirror")
    root = tmp_path / "data"
    write_dataset(fetch_mnist(data_config, [str(tmp_path / "mirror")], expected_sha256=digests), root)
    return root


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        (
            lambda root: (root / "MNIST/raw/t10k-images-idx3-ubyte").unlink(),
            "t10k-images-idx3-ubyte cannot be read (No such file or directory)",
        ),
        (
            lambda root: (root / "MNIST/manifest.json").write_text("{not json"),
            "manifest.json is not a readable JSON manifest",
        ),
        (lambda root: (root / "MNIST/manifest.json").write_text('{"dataset_digest": "x"}'), "`files` is missing"),
        (lambda root: (root / "MNIST/manifest.json").write_text("[]"), "it is not a JSON object"),
        (
            lambda root: (root / "MNIST/manifest.json").write_bytes(b"\xff\xfe"),
            "manifest.json is not a readable JSON manifest",
        ),
    ],
    ids=["deleted-raw-file", "manifest-not-json", "manifest-without-files", "manifest-a-list", "manifest-not-utf8"],
)
def test_damaged_data_folder_is_named_with_the_restore_command(
    synthetic_root: Path, damage: Callable[[Path], None], expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    damage(synthetic_root)
    code, stderr = _stage_exit(
        lambda: load_split(synthetic_root, "test"), capsys
    )  # what train, export_graph, profile call
    _assert_user_error(code, stderr, expected, "dvc checkout data/MNIST")


def test_gzip_bomb_in_the_mirror_stops_at_the_real_files_size(data_config: DataConfig, tmp_path: Path) -> None:
    bomb_mirror = tmp_path / "bomb"
    bomb_mirror.mkdir()
    member = gzip.compress(bytes(1 << 20), mtime=0)  # 1 MiB of zeros in ~1 kB
    (bomb_mirror / f"{TRAIN_IMAGES}.gz").write_bytes(member * 256)  # 256 MiB once inflated, 256 kB on disk
    tracemalloc.start()
    try:
        with pytest.raises(PipelineError) as caught:
            fetch_mnist(data_config, [str(bomb_mirror)])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert f"decompresses to more than {MNIST_BYTES[TRAIN_IMAGES]:,} bytes, the size of the real file" in str(
        caught.value
    )
    assert peak < 3 * MNIST_BYTES[TRAIN_IMAGES]  # never the 256 MiB


# ---------------------------------------------------------------- point 6: checkpoints


class _Payload:
    """Unpickling this would run code (create a file): weights_only must refuse it."""

    def __init__(self, target: Path) -> None:
        self.target = target

    def __reduce__(self) -> tuple[Any, ...]:
        return (Path.touch, (self.target,))


def _good_payload() -> dict[str, Any]:
    return checkpoint_payload(LabNet(LAB_MODEL), {"epochs": 1}, "digest", {"device": "cpu"}, {"test_accuracy": 0.5})


def _with(change: Callable[[dict[str, Any]], None]) -> Callable[[Path], None]:
    """A good payload changed by `change`, saved with the digest of the changed payload: the checks after the
    digest's must hold on their own (a digest proves no damage since writing, not who wrote the file)."""

    def write(path: Path) -> None:
        payload = _good_payload()
        change(payload)
        torch.save({**payload, DIGEST_KEY: payload_digest(payload) if "state_dict" in payload else ""}, path)

    return write


def _nan_weights(payload: dict[str, Any]) -> None:
    payload["state_dict"]["classifier.fc2.bias"][0] = float("nan")


CHECKPOINTS: list[tuple[str, Callable[[Path], object], str]] = [
    (
        "random-bytes",
        lambda path: path.write_bytes(b"\x80\x02" + random.Random(0).randbytes(4094)),
        "is not a readable checkpoint",
    ),
    (
        "zip-garbage",
        lambda path: path.write_bytes(b"PK\x03\x04" + random.Random(0).randbytes(4092)),
        "is not a readable checkpoint",
    ),
    (
        "pickle-reduce",
        lambda path: torch.save(_Payload(path.with_name("pwned")), path),
        "holds objects that would run code when loaded; it was refused",
    ),
    ("no-state-dict", _with(lambda p: p.pop("state_dict")), "`state_dict` is missing or not a dict"),
    (
        "shape-mismatch",
        _with(lambda p: p["state_dict"].update({"features.conv1.weight": torch.zeros(5, 1, 3, 3)})),
        "holds weights that do not fit its own model config",
    ),
    (
        "absurd-config",
        _with(lambda p: p["model"]["model_config"].update(hidden_units=10**9)),
        "(model_config) describes a network of 9,227,000,018,826 weights",
    ),
    (
        "unknown-config-key",
        _with(lambda p: p["model"]["model_config"].update(dropout=0.1)),
        "`model_config.dropout` is not a known key",
    ),
    (
        "negative-config",
        _with(lambda p: p["model"]["model_config"].update(conv1_channels=-3)),
        "`model_config.conv1_channels` = -3 is not allowed",
    ),
    ("nan-weights", _with(_nan_weights), "training diverged: classifier.fc2.bias hold NaN or infinity"),
    (
        "float64-weights",
        _with(lambda p: p["state_dict"].update({k: v.double() for k, v in p["state_dict"].items()})),
        "not float32",
    ),
    ("other-format", lambda path: torch.save({"format": 7}, path), "is not a checkpoint of format 2"),
    (
        "format-1",  # written before checkpoints carried a digest: cannot be verified
        lambda path: torch.save({**_good_payload(), "format": 1}, path),
        "is a checkpoint of format 1, written before checkpoints carried a digest of their payload",
    ),
]


CheckpointCase = tuple[str, Callable[[Path], object], str]  # name, how to write the file, the message expected


@pytest.mark.parametrize("case", CHECKPOINTS, ids=[name for name, _, _ in CHECKPOINTS])
def test_bad_checkpoint_is_refused_before_the_model_is_built(
    tmp_path: Path,
    case: tuple[str, Callable[[Path], object], str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    name, write, expected = case
    path = tmp_path / "model.pt"
    write(path)
    if name == "absurd-config":  # never allocate: the refusal must come from the estimate
        monkeypatch.setattr(torch.nn.Linear, "__init__", lambda *args, **kwargs: pytest.fail("built the model"))
    code, stderr = _stage_exit(lambda: load_checkpoint(path), capsys)
    _assert_user_error(code, stderr, str(path), expected)
    assert "dvc checkout models/model.pt" in stderr or "dvc repro train" in stderr
    assert not (tmp_path / "pwned").exists()


def _edit_one_weight(path: Path) -> None:
    """One float of the state_dict changed in the loaded payload and the file saved again, digest and all."""
    payload = torch.load(path, weights_only=True)
    payload["state_dict"]["classifier.fc1.weight"][3, 7] += 1e-3
    torch.save(payload, path)


def _flip_one_bit(path: Path) -> None:
    """The lowest bit of one weight flipped in the file's bytes, found by searching for the tensor's bytes: the
    zip container and the pickle are untouched (a flip there fails to unpickle, a case tested above)."""
    data = bytearray(path.read_bytes())
    weights = torch.load(path, weights_only=True)["state_dict"]["classifier.fc2.bias"].numpy().tobytes()
    assert data.count(weights) == 1
    data[data.find(weights)] ^= 0x01  # little-endian: the mantissa's last bit, still a finite float
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_edit_one_weight, _flip_one_bit], ids=["edited-and-saved", "raw-bit-flip"])
def test_a_checkpoint_changed_after_training_is_refused_though_it_unpickles(
    tmp_path: Path, damage: Callable[[Path], None], capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "model.pt"
    save_checkpoint(_good_payload(), path)
    intact = torch.load(path, weights_only=True)
    damage(path)
    changed = torch.load(path, weights_only=True)  # still unpickles, with the written digest ...
    assert changed[DIGEST_KEY] == intact[DIGEST_KEY]
    assert [
        name for name, tensor in changed["state_dict"].items() if not torch.equal(tensor, intact["state_dict"][name])
    ]
    code, stderr = _stage_exit(lambda: load_checkpoint(path), capsys)  # ... but no loader accepts it
    _assert_user_error(
        code,
        stderr,
        f"{path} does not match the digest written with it",
        "Restore it with `dvc checkout models/model.pt`, or retrain with `dvc repro -f train`.",
    )


def test_an_intact_checkpoint_loads_and_its_digest_covers_every_field(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    payload = _good_payload()
    save_checkpoint(payload, path)
    loaded = load_checkpoint(path)
    assert all(torch.equal(loaded.model.state_dict()[name], tensor) for name, tensor in payload["state_dict"].items())
    assert loaded.metrics == {"test_accuracy": 0.5}
    written = torch.load(path, weights_only=True)
    assert written[DIGEST_KEY] == payload_digest(payload) == payload_digest(written)  # stable through a save
    for field, value in [("train_params", {"epochs": 2}), ("data_digest", "other"), ("runtime", {"device": "cuda"})]:
        assert payload_digest({**payload, field: value}) != written[DIGEST_KEY], field


@pytest.mark.slow  # starts a process that imports torch or MLflow: seconds, so `make test` only
def test_a_timing_process_refuses_a_checkpoint_changed_after_the_stage_loaded_it(tmp_path: Path) -> None:
    # The profile stage loads the checkpoint, then its timing processes load it again: each load is verified, and
    # the refusal comes back as the one paragraph, not a worker's traceback.
    path = tmp_path / "model.pt"
    save_checkpoint(_good_payload(), path)
    _flip_one_bit(path)
    spec = WorkerSpec(
        str(path), str(tmp_path / "data"), "cpu", ((1, "inference"),), 1, 1, 2.0, 0.1, tune_allocator=False
    )
    with worker_server() as server, pytest.raises(PipelineError) as refused:
        ask(server, spec)
    message = str(refused.value)
    assert "does not match the digest written with it" in message and "dvc checkout models/model.pt" in message
    assert "Traceback" not in message


@pytest.mark.slow  # starts a process that imports torch or MLflow: seconds, so `make test` only
def test_stages_run_directly_refuse_a_checkpoint_changed_after_training(project_copy: Path, run_in: Any) -> None:
    # Run by hand, not through `dvc repro`, nothing compares the file with dvc.lock: the checkpoint's own digest
    # is what stops them. Both stop at the checkpoint, before they need data/MNIST.
    checkpoint = project_copy / "models/model.pt"
    checkpoint.parent.mkdir(exist_ok=True)
    save_checkpoint(_good_payload(), checkpoint)
    _flip_one_bit(checkpoint)
    for command in (["stages.export_graph"], ["stages.profile", "cpu"]):
        result = run_in(project_copy, sys.executable, "-m", *command)
        _assert_user_error(
            result.returncode,
            result.stderr,
            "models/model.pt does not match the digest written with it",
            "dvc checkout models/model.pt",
        )
    assert not (project_copy / "graph/model.pt2").exists()


@pytest.mark.parametrize("header", [b"\x80\x02", b"PK\x03\x04"], ids=["pickle", "zip"])
def test_any_garbage_after_a_checkpoint_header_is_refused_clearly(tmp_path: Path, header: bytes) -> None:
    # One run in 16 of the old random-bytes case failed CI: the unpickler raised IndexError, KeyError
    # or UnicodeDecodeError depending on the bytes. 400 fixed seeds cover each of those kinds.
    path = tmp_path / "model.pt"
    for seed in range(400):
        path.write_bytes(header + random.Random(seed).randbytes(4094))
        with pytest.raises(PipelineError, match=r"is not a readable checkpoint \(.+\)\. Restore it with"):
            load_checkpoint(path)


def test_a_diverged_training_writes_no_checkpoint() -> None:
    model = LabNet(LAB_MODEL)
    layer = model.get_submodule("classifier.fc1")
    assert isinstance(layer, torch.nn.Linear)
    with torch.no_grad():
        layer.weight[0, 0] = float("inf")
    expected = (
        r"training diverged: test_loss, classifier\.fc1\.weight hold NaN or infinity, so no checkpoint was written"
    )
    with pytest.raises(PipelineError, match=expected):
        checkpoint_payload(model, {}, "digest", {}, {"test_loss": float("nan")})


def test_onnx_parity_check_never_lets_nan_through(tmp_path: Path) -> None:
    import onnx
    from onnx import TensorProto, helper

    # (N, 1, 28, 28) → flatten → first 10 columns: a valid ONNX program shaped like the model's output.
    graph = helper.make_graph(
        [
            helper.make_node("Flatten", ["images"], ["flat"], axis=1),
            helper.make_node("Slice", ["flat", "starts", "ends", "axes"], ["log_probabilities"]),
        ],
        "tiny",
        [helper.make_tensor_value_info("images", TensorProto.FLOAT, ["batch", 1, 28, 28])],
        [helper.make_tensor_value_info("log_probabilities", TensorProto.FLOAT, ["batch", 10])],
        [
            helper.make_tensor(name, TensorProto.INT64, [1], [value])
            for name, value in (("starts", 0), ("ends", 10), ("axes", 1))
        ],
    )
    path = tmp_path / "tiny.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)], ir_version=9), str(path))

    class Matching(torch.nn.Module):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return images.flatten(1)[:, :10]

    class Diverged(Matching):
        def forward(self, images: torch.Tensor) -> torch.Tensor:
            return super().forward(images) * float("nan")

    images = torch.randn(4, 1, 28, 28)
    assert [check.max_abs_difference for check in check_onnx(path, Matching(), images, (1, 4), 1e-4)] == [0.0, 0.0]  # type: ignore[arg-type]
    with pytest.raises(
        PipelineError, match=r"differs from PyTorch by nan at batch size 1, more than `graph.parity_atol`"
    ):
        check_onnx(path, Diverged(), images, (1, 4), 1e-4)  # type: ignore[arg-type]


# ---------------------------------------------------------------- point 7: the tracking store


@pytest.fixture(scope="module")
def healthy_store(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    """The bytes of a real MLflow SQLite store holding one finished run."""
    root = tmp_path_factory.mktemp("store")
    empty_store(root)
    saved = os.environ.pop("MLFLOW_TRACKING_URI", None)
    try:
        with open_tracker(
            "probe",
            TrackingConfig(experiment="store-test", tensorboard_dir="runs", registered_model="lab-model"),
            root=root,
        ) as tracker:
            tracker.log_metrics({"x": 1.0})
    finally:
        if saved is not None:
            os.environ["MLFLOW_TRACKING_URI"] = saved
    return (root / "mlflow.db").read_bytes()


STORE_DAMAGE: list[tuple[str, Callable[[bytes], bytes], str]] = [
    (
        "garbage",
        lambda good: random.Random(0).randbytes(len(good)),
        "is not a readable SQLite database (file is not a database)",
    ),
    (
        "truncated",
        lambda good: good[: len(good) // 2],
        "is not a readable SQLite database (database disk image is malformed)",
    ),
    ("overwritten-pages", lambda good: good[:8192] + random.Random(0).randbytes(8192) + good[16384:], "MLflow store"),
    ("empty", lambda good: b"", "is empty (0 bytes): whatever runs it held are gone"),
]


@pytest.mark.parametrize(("name", "damage", "expected"), STORE_DAMAGE, ids=[name for name, _, _ in STORE_DAMAGE])
def test_damaged_tracking_store_is_refused_and_left_as_it_is(
    healthy_store: bytes,
    tmp_path: Path,
    name: str,
    damage: Callable[[bytes], bytes],
    expected: str,
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    database = tmp_path / "mlflow.db"
    database.write_bytes(damage(healthy_store))
    before = database.read_bytes()

    def stage() -> None:
        with open_tracker(
            "probe",
            TrackingConfig(experiment="store-test", tensorboard_dir="runs", registered_model="lab-model"),
            root=tmp_path,
        ):
            pytest.fail("the stage ran on a damaged store")

    code, stderr = _stage_exit(stage, capsys)
    _assert_user_error(code, stderr, str(database), expected, f"mv {database} {database}.damaged", "Nothing was run")
    assert database.read_bytes() == before
    assert not (tmp_path / "runs").exists()


# ---------------------------------------------------------------- point 9: all or nothing


def _make_unreplaceable(path: Path) -> Callable[[], object]:
    """Make renaming over/away `path` fail: immutable (chattr +i) where allowed, else a read-only folder."""
    if (
        shutil.which("chattr")
        and subprocess.run(["chattr", "+i", str(path)], check=False, capture_output=True).returncode == 0
    ):
        return lambda: subprocess.run(["chattr", "-i", str(path)], check=True)
    if os.geteuid() != 0:
        path.parent.chmod(0o555)
        return lambda: path.parent.chmod(0o755)
    pytest.skip("neither chattr +i nor a read-only folder can stop a rename here")


def test_commit_is_all_or_nothing_when_one_rename_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    finals = [Path("models/model.pt"), Path("metrics/train.json"), Path("plots/train_epochs.csv")]
    for final in finals:
        final.parent.mkdir(parents=True)
        final.write_text(f"old {final}")
    restore = _make_unreplaceable(finals[-1])
    try:

        def stage() -> None:
            with AtomicOutputs() as outputs:
                for final in finals:
                    outputs.write_text(final, f"new {final}")

        code, stderr = _stage_exit(stage, capsys, name="train")
    finally:
        restore()
    _assert_user_error(
        code, stderr, "could not replace plots/train_epochs.csv", "every output of this stage was left as it was"
    )
    assert [final.read_text() for final in finals] == [f"old {final}" for final in finals]
    assert list(tmp_path.rglob(".partial-*")) == []


def test_files_an_owned_folder_no_longer_holds_go_with_the_commit_and_stay_when_it_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """AtomicOutputs.own: a direct run removes what its new outputs no longer hold, all or nothing."""
    monkeypatch.chdir(tmp_path)
    old = {Path("report/report.md"): "old report", Path("report/handin.zh.md"): "old zh", Path("report/f/a.png"): "a"}
    for final, text in old.items():
        final.parent.mkdir(parents=True, exist_ok=True)
        final.write_text(text)
    blocker = Path("report/report.md")

    def stage() -> None:
        with AtomicOutputs() as outputs:
            outputs.own(Path("report"))
            outputs.write_text(blocker, "new report")

    restore = _make_unreplaceable(blocker)
    try:
        code, stderr = _stage_exit(stage, capsys, name="report")
    finally:
        restore()
    _assert_user_error(code, stderr, "could not replace report/report.md", "every output of this stage was left")
    assert {final: final.read_text() for final in old} == old  # the stale files stay with the old set
    run_stage("report", stage)
    assert sorted(str(path) for path in Path("report").rglob("*") if path.is_file()) == ["report/report.md"]
    assert blocker.read_text() == "new report"


def _dead_pid() -> int:
    finished = subprocess.Popen([sys.executable, "-c", "pass"])
    finished.wait()  # its pid now names no process
    return finished.pid


@pytest.fixture
def live_pid() -> Iterator[int]:
    """The pid of a running process other than this one (a stage still writing), ended after the test."""
    sleeper = subprocess.Popen(["sleep", "600"])
    yield sleeper.pid
    sleeper.kill()
    sleeper.wait()


def _leave(folders: list[Path]) -> None:
    for folder in folders:
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "file").write_text("x")


def test_any_stage_removes_what_killed_runs_left_in_every_output_folder(tmp_path: Path, live_pid: int) -> None:
    # A SIGKILLed download leaves data/.MNIST.partial-*, and the next `dvc repro` need not rerun download: the
    # first stage to start, whichever, removes it.
    dead = _dead_pid()
    left = [
        tmp_path / f"data/.MNIST.partial-{dead}-k2j3",
        tmp_path / f"data/.MNIST.old-{dead}-x9",
        tmp_path / f"profiles/cpu/1-train/.partial-{dead}",
        tmp_path / f"models/.partial-{dead}",
        tmp_path / f"graph/.partial-{dead}",
        tmp_path / f"report/figures/.partial-{dead}",
    ]
    kept = [
        tmp_path / f"data/.MNIST.partial-{live_pid}-a1b2",
        tmp_path / f"profiles/cpu/1-train/.partial-{live_pid}",
        tmp_path / f"models/.partial-{os.getpid()}",
        tmp_path / "profiles/cpu/1-train/.hidden",
        tmp_path / "data/MNIST",
    ]
    _leave(left + kept)
    prepare_output_folders("validate", root=tmp_path)  # its own folder is checks/: it sweeps all the same
    assert [folder for folder in left if folder.exists()] == []
    assert all((folder / "sub" / "file").is_file() for folder in kept)
    assert sweep_killed_runs(tmp_path) == []  # nothing left to remove: a second stage start finds nothing


def test_validate_stage_removes_a_killed_download_s_leftovers(project_copy: Path, run_in: Any, live_pid: int) -> None:
    dead = project_copy / f"data/.MNIST.partial-{_dead_pid()}-q7w8"
    live = project_copy / f"data/.MNIST.partial-{live_pid}-e4r5"
    _leave([dead, live])
    result = run_in(project_copy, sys.executable, "-m", "stages.validate")
    assert result.returncode == 0, result.stderr
    assert not dead.exists()
    assert (live / "sub" / "file").read_text() == "x"


# ---------------------------------------------------------------- point 8: full and read-only disks


@functools.cache
def _namespaces_work() -> bool:
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(
        # /tmp only in this namespace: nothing is left behind
        ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /tmp"],
        check=False,
        capture_output=True,
    )
    return probe.returncode == 0


FULL, READ_ONLY = "-t tmpfs -o size=1m tmpfs", "--bind -o ro {folder}"
# name: (how the folder is mounted, the folder, the stage, what it must say).
DISK_CASES = {
    "train-models-full": (FULL, "models", "stages.train", "models/ has only 1.0 MiB free"),
    "train-models-read-only": (
        READ_ONLY,
        "models",
        "stages.train",
        "cannot write into models/ (Read-only file system)",
    ),
    "export-graph-full": (FULL, "graph", "stages.export_graph", "graph/ has only 1.0 MiB free"),
    "profile-full": (FULL, "profiles", "stages.profile", "profiles/ has only 1.0 MiB free"),
    "download-data-full": (FULL, "data", "stages.download", "data/ has only 1.0 MiB free"),
    "mlartifacts-full": (FULL, "mlartifacts", "stages.download", "mlartifacts/mnist-lab/ has only 1.0 MiB free"),
}

# Runs inside `unshare -rm` (mapped root in its own mount namespace) in a project copy: each case
# mounts its folder, runs the stage's module as `python -m` would (one process: torch loads once),
# unmounts. Then writes that fail halfway, on a 70 MiB tmpfs: past the 64 MiB check before a stage.
DISK_SCRIPT = r"""
import contextlib, io, json, os, runpy, subprocess, sys
from pathlib import Path

os.chdir(sys.argv[1])
os.environ["DVC_STAGE"] = "profile@cpu"  # as DVC sets it for the profile stage
report = {}

def as_stage(run):
    stderr = io.StringIO()
    try:
        with contextlib.redirect_stderr(stderr):
            run()
        code = 0
    except SystemExit as exited:
        code = exited.code
    partials = [str(path) for path in Path(".").rglob(".partial-*")]
    return {"code": code, "stderr": stderr.getvalue(), "partials": partials}

for name, (how, folder, module) in json.loads(sys.argv[2]).items():
    subprocess.run(["mount", *how.format(folder=folder).split(), folder], check=True)
    sys.argv = [module]
    report[name] = as_stage(lambda: runpy.run_module(module, run_name="__main__", alter_sys=True))
    subprocess.run(["umount", folder], check=True)

from pipeline.common.outputs import AtomicOutputs
from pipeline.model.checkpoint import checkpoint_payload, save_checkpoint
from pipeline.common.stage_runner import run_stage
from pipeline.common.errors import PipelineError
from pipeline.model.network import LabNet
from tests.helpers.data import LAB_MODEL

subprocess.run(["mount", "-t", "tmpfs", "-o", "size=70m", "tmpfs", "models"], check=True)
Path("models/filler").write_bytes(bytes(68 << 20))
try:
    with AtomicOutputs() as outputs:
        payload = checkpoint_payload(LabNet(LAB_MODEL), {}, "digest", {}, {})
        save_checkpoint(payload, outputs.staged(Path("models/model.pt")))
except PipelineError as error:
    report["checkpoint"] = str(error)
try:
    with AtomicOutputs() as outputs:
        outputs.write_text(Path("models/log.txt"), "x" * (4 << 20))
except PipelineError as error:
    report["text"] = str(error)
Path("models/filler").unlink()
report["left"] = sorted(os.listdir("models"))

def fill_the_disk():  # passes the check before the stage, then a write() that names no file fails
    with open("models/big.bin", "wb") as stream:
        stream.write(bytes(80 << 20))

report["unnamed"] = as_stage(lambda: run_stage("train", fill_the_disk))
subprocess.run(["umount", "models"], check=True)
print(json.dumps(report))
"""


@pytest.fixture(scope="module")
def disk_report(
    tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path
) -> tuple[Path, dict[str, Any], dict[str, int]]:
    """Run DISK_SCRIPT in a fresh project copy; return the copy, the report and its files' mtimes before."""
    if not _namespaces_work():
        pytest.skip("needs `unshare -rm` (user and mount namespaces) to mount a small tmpfs without root")
    project = copy_project(tmp_path_factory.mktemp("disk") / "project")
    for folder in ("models", "graph", "profiles", "data", "mlartifacts"):
        (project / folder).mkdir(exist_ok=True)
    before = _files(project)
    cases = json.dumps({name: (how, folder, module) for name, (how, folder, module, _) in DISK_CASES.items()})
    environment = stage_environment(mnist_mirror, {"PYTHONPATH": str(REPO_ROOT)})
    result = run_command(
        ["unshare", "-rm", sys.executable, "-c", DISK_SCRIPT, str(project), cases], project, environment
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return project, json.loads(result.stdout.strip().splitlines()[-1]), before


def _files(project: Path) -> dict[str, int]:
    """mtime of every file but git's and Python's bytecode caches (written by importing stage code)."""
    return {
        str(path.relative_to(project)): path.stat().st_mtime_ns
        for path in project.rglob("*")
        if path.is_file() and ".git" not in path.parts and "__pycache__" not in path.parts
    }


@pytest.mark.slow
@pytest.mark.parametrize("case", list(DISK_CASES))
def test_full_or_read_only_output_folder_is_named_before_any_work(
    case: str, disk_report: tuple[Path, dict[str, Any], dict[str, int]]
) -> None:
    _, report, _ = disk_report
    outcome, expected = report[case], DISK_CASES[case][-1]
    assert outcome["code"] == 2, outcome
    assert expected in outcome["stderr"], outcome
    assert "Nothing was run" in outcome["stderr"], outcome
    assert "Traceback" not in outcome["stderr"]
    assert outcome["partials"] == []


@pytest.mark.slow
def test_refused_stages_changed_no_file(disk_report: tuple[Path, dict[str, Any], dict[str, int]]) -> None:
    project, _, before = disk_report
    after = _files(project)
    # The download stage creates the MLflow store (and its lock) before it learns where artifacts go.
    changed = {path for path in after if before.get(path) != after[path]} - {"mlflow.db", "mlflow.db.lock"}
    assert not changed, changed


@pytest.mark.slow
def test_disk_filling_up_during_a_write_is_a_clear_error(
    disk_report: tuple[Path, dict[str, Any], dict[str, int]],
) -> None:
    _, report, _ = disk_report
    assert report["checkpoint"].startswith("could not write the checkpoint models/.partial-")
    assert "Free space (or fix permissions) in models/ and run again. Nothing was written." in report["checkpoint"]
    assert report["text"].startswith(
        "could not write models/log.txt (No space left on device): the file system holding models/ is full"
    )
    assert report["left"] == []  # nothing half-written stays
    unnamed = report["unnamed"]
    assert unnamed["code"] == 2
    assert "could not write (No space left on device): models/ has only" in unnamed["stderr"]
    assert "Traceback" not in unnamed["stderr"]


# The TensorBoard folder fills up while export_graph writes its graph: 4 KiB left on a 70 MiB tmpfs over runs/.
FULL_RUNS_SCRIPT = r"""
set -e
mount -t tmpfs -o size=70m tmpfs runs
python -c 'open("runs/filler", "wb").write(bytes((70 << 20) - (4 << 10)))'
set +e
python -m stages.export_graph
echo "exit $?" >&2
umount runs
"""


@pytest.mark.slow
def test_a_full_tensorboard_folder_fails_the_stage_and_its_run_with_one_message(
    tmp_path: Path, reproduced_project: Path, mnist_mirror: Path
) -> None:
    """The graph's events cannot be written. The stage exits 2 naming runs/, prints no thread
    traceback (torch's SummaryWriter wrote from a thread of its own, which printed `Exception in thread` and failed
    the stage with an error blaming the tracer), leaves its outputs as they were, and its run is FAILED."""
    if not _namespaces_work():
        pytest.fail("needs `unshare -rm` (user and mount namespaces) to mount a small tmpfs without root")
    project = clone_project(reproduced_project, tmp_path / "project")
    (project / "runs").mkdir(exist_ok=True)
    before = {name: mtime for name, mtime in _files(project).items() if name.startswith("graph/")}
    environment = stage_environment(mnist_mirror, {"PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"})
    result = run_command(["unshare", "-rm", "bash", "-c", FULL_RUNS_SCRIPT], project, environment)
    stderr = result.stderr
    assert "exit 2" in stderr, stderr[-3000:]
    assert "error in stage 'export_graph': could not write (No space left on device): runs/ has only" in stderr
    assert "Traceback" not in stderr and "Exception in thread" not in stderr, stderr[-3000:]
    assert {name: mtime for name, mtime in _files(project).items() if name.startswith("graph/")} == before
    client = MlflowClient(f"sqlite:///{project / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("mnist-lab")
    assert experiment is not None
    (newest, *_) = client.search_runs(
        [experiment.experiment_id], "tags.stage = 'export_graph'", order_by=["attributes.start_time DESC"]
    )
    assert newest.info.status == "FAILED"
    assert client.get_run(newest.data.tags["mlflow.parentRunId"]).info.status == "FAILED"
