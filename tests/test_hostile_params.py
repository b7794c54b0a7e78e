"""Bad and hostile params.yaml: no value runs code, no typo costs outputs.

The fast tests check each bad value in process. The slow ones use the real `dvc` CLI on one project
copy reproduced once (validate, download, train, export_graph), then try each bad params.yaml in turn
(restored after each) and check that no command ran and that not one file of the workspace changed.
"""

from __future__ import annotations

import copy
import hashlib
import json
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from pipeline.common.dataset import MNIST_FILES
from pipeline.common.errors import PipelineError
from pipeline.common.machine import machine_fingerprint
from pipeline.common.stage_runner import run_stage
from pipeline.data.mnist import MNIST_BYTES, MNIST_SHA256
from pipeline.devices import cuda
from pipeline.model.network import LabNet
from pipeline.params.loading import load_params
from pipeline.params.memory import check_params_fit_memory, parameter_count
from pipeline.params.parsing import params_from_mapping
from pipeline.params.schema import ModelConfig
from pipeline.params.validation import MARKER_TEXT, check_environment, write_params_checked
from pipeline.profiling.matrix import stage_device
from tests.helpers.projects import (
    clone_project,
    read_params,
    run_command,
    stage_environment,
    write_params,
)
from tests.helpers.repo import REPO_ROOT, run_python

ALIAS_BOMB = "".join(
    f"{name}: &{name} [{', '.join([f'*{previous}'] * 9) if previous else ', '.join(['lol'] * 9)}]\n"
    for previous, name in zip(["", "a", "b", "c"], ["a", "b", "c", "d"], strict=True)
)


def _set(raw: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    *parents, leaf = dotted.split(".")
    target = raw
    for parent in parents:
        target = target[parent]
    target[leaf] = value
    return raw


def _stage_exit(main: Callable[[], None], capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    """Run `main` the way a stage script does (stage_runner.run_stage); return the exit code and stderr."""
    with pytest.raises(SystemExit) as exited:
        run_stage("probe", main)  # a name without output folders: nothing is checked or created
    return int(exited.value.code or 0), capsys.readouterr().err


def _refused(main: Callable[[], object], capsys: pytest.CaptureFixture[str]) -> str:
    """`main`, run as a stage, is refused as a user error (exit 2, no traceback); its stderr."""

    def run() -> None:
        main()

    code, stderr = _stage_exit(run, capsys)
    assert code == 2
    assert "Traceback" not in stderr
    return stderr


# ---------------------------------------------------------------- fast: every bad value, in process

BAD_VALUES = [
    ("train.lr", float("inf"), "`train.lr` = inf is not allowed; it must be a finite number"),
    ("train.lr", float("nan"), "`train.lr` = nan is not allowed; it must be a finite number"),
    (
        "train.gamma",
        10**400,
        "`train.gamma` = 100000000000000000...0000000000000000000 is not allowed; it must be a finite number",
    ),
    ("train.seed", 2**70, "`train.seed` = 1180591620717411303424 is not allowed; it must be >= 0 and <= 4294967295"),
    ("train.epochs", 10**12, "`train.epochs` = 1000000000000 is not allowed; it must be >= 1 and <= 1000"),
    ("profile.batch_sizes", [1.5], "`profile.batch_sizes[0]` = 1.5 has the wrong type; expected an integer"),
    ("profile.batch_sizes", [10**6], "`profile.batch_sizes[0]` = 1000000 is not allowed; it must be >= 1 and <= 10000"),
    ("profile.modes", ["eval"], "`profile.modes[0]` = 'eval' is not allowed; choose one of 'inference', 'train'"),
    ("profile.devices", ["cpu$(touch pwned)"], "`profile.devices[0]` = 'cpu$(touch pwned)' is not allowed"),
    ("tracking.experiment", "x" * 5000, "is not allowed; it must be at most 256 characters long (it has 5000)"),
    (
        "tracking.tensorboard_dir",
        "../../outside",
        "`tracking.tensorboard_dir` = '../../outside' is not allowed; it must be a folder inside the project",
    ),
    (
        "tracking.tensorboard_dir",
        "/tmp/runs",
        "`tracking.tensorboard_dir` = '/tmp/runs' is not allowed; it must be a folder inside the project",
    ),
    (
        "graph.extra",
        1,
        "`graph.extra` is not a known key (allowed in `graph`: onnx_opset, check_batch_sizes, parity_atol)",
    ),
    (
        "data.mirrors",
        ["https://alice:hunter2@example.org/mnist/"],
        "`data.mirrors[0]` = 'https://***@example.org/mnist/' is not allowed; it must be a URL without user name",
    ),
]


@pytest.mark.parametrize(
    ("key", "value", "expected"), BAD_VALUES, ids=[f"{key}={str(value)[:20]}" for key, value, _ in BAD_VALUES]
)
def test_bad_value_is_refused_naming_the_key_and_the_fix(
    repo_params: dict[str, Any], key: str, value: Any, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    raw = _set(repo_params, key, value)

    stderr = _refused(lambda: params_from_mapping(raw), capsys)
    assert expected in stderr, stderr
    assert "The last complete outputs are untouched" in stderr  # DVC removes none (`persist`): nothing to restore
    assert "hunter2" not in stderr


def test_unknown_top_level_key_is_refused(repo_params: dict[str, Any]) -> None:
    repo_params["optimiser"] = {"name": "sgd"}
    with pytest.raises(
        PipelineError, match=r"`optimiser` is not a known key \(allowed in `the top level`: data, train"
    ):
        params_from_mapping(repo_params)


def test_model_too_large_for_memory_is_refused_naming_the_key(repo_params: dict[str, Any]) -> None:
    params = params_from_mapping(_set(repo_params, "train.model.hidden_units", 1_000_000_000))
    with pytest.raises(PipelineError) as caught:
        check_params_fit_memory(params, limit=64 << 30)
    message = str(caught.value)
    assert "asks the train stage for about" in message
    assert "but this machine has 64.0 GiB" in message
    assert "Lower `train.model` in params.yaml" in message
    check_params_fit_memory(params_from_mapping(_set(repo_params, "train.model.hidden_units", 128)), limit=64 << 30)
    big_batch = params_from_mapping(_set(repo_params, "train.batch_size", 60_000))
    with pytest.raises(PipelineError, match=r"Lower `train\.batch_size`"):
        check_params_fit_memory(big_batch, limit=8 << 30)


@pytest.mark.parametrize(
    "model", [ModelConfig(32, 64, 128, 0.25, 0.5), ModelConfig(3, 5, 7, 0.0, 0.0), ModelConfig(1, 1, 1, 0.5, 0.5)]
)
def test_memory_estimate_counts_the_real_networks_weights(model: ModelConfig) -> None:
    assert parameter_count(model) == sum(weight.numel() for weight in LabNet(model).parameters())


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        (b"train:\n  lr: 1.0\n  lr: 2.0\n", "key 'lr' appears twice in one mapping; keep one"),
        (ALIAS_BOMB.encode(), "aliases (*a) are not allowed in params; write the value out"),
        (b"train:\n  lr: \xff\xfe\n", "is not UTF-8 text: byte 0xff on line 2 is not valid UTF-8"),
        (b"seed: " + b"9" * 5000 + b"\n", "holds a value this pipeline cannot read"),
        (b"x: " + b"[" * 20000 + b"]" * 20000 + b"\n", "holds a value this pipeline cannot read"),
        (b"# padding\n" * 120_000, "is larger than 1024 KiB"),
    ],
    ids=["duplicate-key", "alias-bomb", "non-utf8", "5000-digit-int", "deep-nesting", "huge-file"],
)
def test_unreadable_params_file_is_refused_fast(
    tmp_path: Path, content: bytes, expected: str, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "params.yaml"
    path.write_bytes(content)

    stderr = _refused(lambda: load_params(path), capsys)
    assert expected in stderr, stderr
    assert f"Fix {path} and run again" in stderr


def test_params_file_that_is_a_folder_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "params.yaml").mkdir()

    stderr = _refused(lambda: load_params(tmp_path / "params.yaml"), capsys)
    assert "params.yaml cannot be read (Is a directory): it must be a readable YAML file" in stderr


def test_validation_marker_never_changes_and_is_not_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    shutil.copy(REPO_ROOT / "params.yaml", "params.yaml")
    write_params_checked()
    marker, fingerprint = Path("checks/params.ok"), Path("hardware/fingerprint.json")
    assert marker.read_text() == MARKER_TEXT == (REPO_ROOT / "checks/params.ok").read_text()
    # The same stage records the machine (one always-run stage, not two: each costs DVC a dvc.lock rewrite).
    assert json.loads(fingerprint.read_text()) == machine_fingerprint()
    stamps = {path: path.stat().st_mtime_ns for path in (marker, fingerprint)}
    params = read_params(tmp_path)
    params["train"]["epochs"] = 3  # another valid value: same marker, same machine, files untouched
    write_params(tmp_path, params)
    write_params_checked()
    assert {path: path.stat().st_mtime_ns for path in (marker, fingerprint)} == stamps
    fingerprint.write_text('{"cpu": "another machine"}')  # moved: the fingerprint is rewritten, the marker not
    write_params_checked()
    assert json.loads(fingerprint.read_text()) == machine_fingerprint()
    assert marker.stat().st_mtime_ns == stamps[marker]
    params["train"]["epochs"] = 0
    write_params(tmp_path, params)
    fingerprint.write_text('{"cpu": "another machine"}')
    with pytest.raises(PipelineError, match=r"`train\.epochs` = 0 is not allowed"):
        write_params_checked()
    assert marker.read_text() == MARKER_TEXT
    assert fingerprint.read_text() == '{"cpu": "another machine"}'  # bad params: nothing written


def test_validate_stage_imports_no_torch_or_mlflow() -> None:
    code = (
        "import sys, stages.validate, pipeline.params.validation; "
        "print(sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'mlflow', 'numpy'}))"
    )
    result = run_python(code)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


def test_profile_device_comes_from_dvc_stage_name_never_from_a_command_line(repo_params: dict[str, Any]) -> None:
    config = params_from_mapping(repo_params).profile
    assert stage_device(config, [], {"DVC_STAGE": "profile@cpu"}) == "cpu"
    assert stage_device(config, [], {"DVC_STAGE": "sub/dvc.yaml:profile@cpu"}) == "cpu"
    assert stage_device(config, ["cuda"], {}) == "cuda"  # a direct run names any device; select_device checks it
    for stage in ("profile@cpu; touch pwned; #", "profile@cuda", "profile@16-cpu-train", "train"):
        with pytest.raises(PipelineError, match=r"none of the devices params\.yaml lists"):
            stage_device(config, [], {"DVC_STAGE": stage})
    with pytest.raises(PipelineError, match=r"usage: python -m stages\.profile DEVICE, with DEVICE one of cpu, cuda"):
        stage_device(config, ["16", "cpu", "train"], {})
    with pytest.raises(PipelineError, match="no profile device given"):
        stage_device(config, [], {})


def test_no_stage_command_holds_an_interpolated_value() -> None:
    """DVC runs `cmd` through a shell after interpolating `${...}`: no value may ever get there."""
    stages = yaml.safe_load((REPO_ROOT / "dvc.yaml").read_text())["stages"]
    for name, definition in stages.items():
        stage = definition.get("do", definition)  # a `foreach` stage's body is under `do`
        assert "${" not in str(stage["cmd"]), name
        if name != "validate":
            assert "checks/params.ok" in stage["deps"], f"{name} must depend on the validate stage's output"


# ---------------------------------------------------------------- slow: the real dvc CLI


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory, mnist_mirror: Path, reproduced_project: Path) -> Path:
    """A project copy after `dvc repro` (data, model, graph files, profiles), its profile matrix cut to one
    combination and all of it committed to git."""
    project = clone_project(reproduced_project, tmp_path_factory.mktemp("guarded") / "project")
    params = read_params(project)
    params["profile"].update(batch_sizes=[1], modes=["inference"])
    write_params(project, params)
    result = run_command(["dvc", "repro", "validate"], project, stage_environment(mnist_mirror))
    assert result.returncode == 0, result.stderr[-3000:]
    subprocess.run(["git", "add", "-A"], cwd=project, check=True)
    subprocess.run(
        ["git", "-c", "user.name=t", "-c", "user.email=t@e", "commit", "-qm", "outputs"], cwd=project, check=True
    )
    return project


def _workspace(project: Path) -> dict[str, str]:
    """SHA-256 of every file but git's and DVC's own bookkeeping and params.yaml itself."""
    digests = {}
    for path in sorted(project.rglob("*")):
        relative = path.relative_to(project)
        if relative.parts[0] in (".git", ".dvc") or relative == Path("params.yaml") or not path.is_file():
            continue
        digests[str(relative)] = hashlib.sha256(path.read_bytes()).hexdigest()
    return digests


def _outside(project: Path) -> list[str]:
    """What exists beside the project in its temp folder (a command writing outside would show here)."""
    return sorted(path.name for path in project.parent.iterdir())


OUTPUTS = (
    "data/MNIST/manifest.json",
    "models/model.pt",
    "metrics/train.json",
    "plots/train_epochs.csv",
    "graph/model.onnx",
    "graph/model.pt2",
    "graph/summary.md",
    "checks/params.ok",
)

HOSTILE = {
    "profile.batch_sizes": [1, "1 cpu inference; touch pwned; #"],
    "profile.devices": ["cpu", "cpu$(touch pwned)", "cpu`touch pwned`", "cpu'; touch pwned; echo '"],
}


@pytest.mark.slow
def test_params_values_never_reach_a_shell(guarded: Path, run_in: Any) -> None:
    """Each way DVC could run the profile cmd with hostile matrix values; `touch pwned` never runs."""
    before, outside = _workspace(guarded), _outside(guarded)
    assert all(relative in before for relative in OUTPUTS)
    clean = read_params(guarded)
    hostile = read_params(guarded)
    for key, value in HOSTILE.items():
        _set(hostile, key, value)
    write_params(guarded, hostile)
    listed = run_in(guarded, "dvc", "stage", "list", "--name-only").stdout.split("\n")
    names = [name for name in listed if name.startswith("profile@") and "pwned" in name]
    assert len(names) == 3  # DVC accepts these values into stage names: only the cmd must not carry them

    attempts = [
        ["dvc", "repro"],
        ["dvc", "repro", names[0]],  # upstream stages first: validate stops it
        ["dvc", "repro", "--single-item", names[1]],  # skips validate: the cmd itself holds no value
        ["dvc", "repro", "--single-item", names[-1]],
    ]
    for command in attempts:
        result = run_in(guarded, *command)
        assert result.returncode != 0, command
        assert "is not allowed; it must be one of 'cpu', 'cuda', 'mps'" in result.stderr, (
            command,
            result.stderr[-2000:],
        )
        assert "Traceback" not in result.stderr
        assert not list(guarded.rglob("pwned")), command
        assert "pwned" not in _outside(guarded), command
        assert _workspace(guarded) == before, command
    write_params(guarded, clean)
    result = run_in(guarded, "dvc", "exp", "run", "-S", 'profile.devices=["cpu","cpu$(touch pwned)"]')
    assert result.returncode != 0
    assert "`profile.devices[1]` = 'cpu$(touch pwned)' is not allowed" in result.stderr
    assert not list(guarded.rglob("pwned"))
    assert _outside(guarded) == outside
    assert _workspace(guarded) == before
    write_params(guarded, clean)


def _replace_text(*pairs: tuple[str, str]) -> Callable[[Path], None]:
    def edit(project: Path) -> None:
        path = project / "params.yaml"
        text = path.read_text()
        for old, new in pairs:
            assert old in text, old
            text = text.replace(old, new, 1)
        path.write_text(text)

    return edit


def _append(content: bytes) -> Callable[[Path], None]:
    def edit(project: Path) -> None:
        with (project / "params.yaml").open("ab") as stream:
            stream.write(content)

    return edit


def _make_folder(project: Path) -> None:
    (project / "params.yaml").unlink()
    (project / "params.yaml").mkdir()


# Every value-level typo of the audit at once: the validate stage reports them all in one message.
VALUE_TYPOS = {
    "lr: 1.0": ("lr: .inf", "`train.lr` = inf is not allowed; it must be a finite number"),
    "seed: 1": (f"seed: {2**70}", "`train.seed` = 1180591620717411303424 is not allowed"),
    "epochs: 1": (f"epochs: {10**12}", "`train.epochs` = 1000000000000 is not allowed"),
    "  batch_sizes:\n  - 1\n": ("  batch_sizes:\n  - 1.5\n", "`profile.batch_sizes[0]` = 1.5 has the wrong type"),
    "modes:\n  - inference": ("modes:\n  - eval", "`profile.modes[0]` = 'eval' is not allowed"),
    "experiment: mnist-lab": ("experiment: " + "x" * 5000, "at most 256 characters long (it has 5000)"),
    "tensorboard_dir: runs": (
        "tensorboard_dir: ../outside",
        "`tracking.tensorboard_dir` = '../outside' is not allowed",
    ),
    "  languages:\n  - zh\n": (
        "  languages:\n  - fr\n",
        "`report.languages[0]` = 'fr' is not allowed; choose one of 'zh', 'en'",
    ),
    "\ntracking:\n": ("\noptimiser: {name: sgd}\ntracking:\n", "`optimiser` is not a known key"),
    "mirrors:\n": (
        "mirrors:\n  - https://alice:hunter2@example.org/mnist/\n",
        "`data.mirrors[0]` = 'https://***@example.org/mnist/'",
    ),
}

# (edit, text the failure must show). The first two reach the validate stage; DVC itself refuses the
# others while it reads params.yaml, before running any stage (the alias bomb is small: DVC expands
# aliases while it reads params for `${...}`, slowly for a large one — see dvc.yaml).
FILE_TYPOS: list[tuple[str, Callable[[Path], None], list[str]]] = [
    (
        "values",
        _replace_text(*((old, new) for old, (new, _) in VALUE_TYPOS.items())),
        [m for _, m in VALUE_TYPOS.values()] + ["`optimiser` is not a known key"],
    ),
    (
        "huge model",
        _replace_text(("hidden_units: 128", "hidden_units: 1000000000")),
        ["asks the train stage for about", "Lower `train.model` in params.yaml"],
    ),
    ("small alias bomb", _append(ALIAS_BOMB.encode()), ["aliases (*a) are not allowed in params"]),
    ("duplicate key", _replace_text(("top_k: 10", "top_k: 10\n  top_k: 11")), ['found duplicate key "top_k"']),
    ("not UTF-8", _append(b"# \xff\xfe\n"), ["'params.yaml', is not valid utf-8"]),
    ("a folder", _make_folder, ["'params.yaml' is a directory"]),
    ("broken YAML", _append(b"train: [unclosed\n"), ["'params.yaml', YAML file structure is corrupted"]),
]


@pytest.mark.slow
def test_bad_params_through_dvc_repro_cost_no_output(guarded: Path, run_in: Any) -> None:
    """`dvc repro` (and `dvc repro train`) with each bad params.yaml: refused before any output is touched."""
    original = (guarded / "params.yaml").read_bytes()
    before, outside = _workspace(guarded), _outside(guarded)
    for name, edit, expected in FILE_TYPOS:
        edit(guarded)
        for command in (["dvc", "repro"], ["dvc", "repro", "train"]) if name == "values" else (["dvc", "repro"],):
            result = run_in(guarded, *command)
            shown = result.stdout + result.stderr
            assert result.returncode != 0, (name, shown[-2000:])
            for text in expected:
                assert text in shown, (name, text, shown[-3000:])
            assert "Traceback" not in shown, name
            assert "hunter2" not in shown, name
            assert _workspace(guarded) == before, name
            assert _outside(guarded) == outside, name
        if (guarded / "params.yaml").is_dir():
            (guarded / "params.yaml").rmdir()
        (guarded / "params.yaml").write_bytes(original)
    result = run_in(guarded, "dvc", "status", "--json", "--with-deps", "export_graph")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {"validate": ["always changed"]}, result.stdout  # nothing else changed


@pytest.mark.slow
def test_valid_params_edit_reruns_validate_and_nothing_it_does_not_touch(guarded: Path, run_in: Any) -> None:
    params = read_params(guarded)
    params["tracking"]["experiment"] = "another-name"
    write_params(guarded, params)
    result = run_in(guarded, "dvc", "repro", "export_graph")
    assert result.returncode == 0, result.stderr[-2000:]
    assert "Running stage 'validate'" in result.stdout
    for stage in ("download", "train", "export_graph"):
        assert f"Stage '{stage}' didn't change, skipping" in result.stdout
    assert (guarded / "checks/params.ok").read_text() == MARKER_TEXT
    subprocess.run(["git", "checkout", "-q", "params.yaml", "dvc.lock"], cwd=guarded, check=True)


def _params_with(repo_params: dict[str, Any], **train: Any) -> Any:
    params = copy.deepcopy(repo_params)
    params["train"].update(train)
    return params_from_mapping(params)


def test_validate_refuses_what_this_machine_cannot_do(
    repo_params: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In process: a device the machine lacks, more samples than the split, a mirror folder that
    is gone or empty when the data set is not in place; torch-free (the stage runs at every `dvc repro`)."""
    monkeypatch.chdir(tmp_path)
    no_gpu, one_gpu = tmp_path / "none", tmp_path / "gpus"
    no_gpu.mkdir()
    (one_gpu / "0000:01:00.0").mkdir(parents=True)
    monkeypatch.setattr(cuda, "NVIDIA_GPUS", no_gpu)
    mirror = {"MNIST_MIRROR": str(tmp_path / "mirror")}
    with pytest.raises(PipelineError, match=r"`train.device` asks for cuda, but this machine shows no NVIDIA GPU"):
        check_environment(_params_with(repo_params, device="cuda"), tmp_path, {})
    with monkeypatch.context() as with_gpu:
        with_gpu.setattr(cuda, "NVIDIA_GPUS", one_gpu)
        check_environment(_params_with(repo_params, device="cuda"), tmp_path, {})  # a GPU: fine
    with pytest.raises(PipelineError, match=r"`train.train_samples` is 70,000, but the MNIST train split has 60,000"):
        check_environment(_params_with(repo_params, train_samples=70_000), tmp_path, {})
    with pytest.raises(PipelineError, match=r"`train.test_samples` is 10,001, but the MNIST test split has 10,000"):
        check_environment(_params_with(repo_params, test_samples=10_001), tmp_path, {})
    params = _params_with(repo_params)
    with pytest.raises(PipelineError, match=r"MNIST_MIRROR=.*mirror' is not a folder, and the download stage needs it"):
        check_environment(params, tmp_path, mirror)
    (tmp_path / "mirror").mkdir()
    (tmp_path / "mirror" / "train-images-idx3-ubyte.gz").write_bytes(b"")
    (tmp_path / "mirror" / "t10k-labels-idx1-ubyte").write_bytes(b"")
    with pytest.raises(PipelineError, match=r"lacks train-labels-idx1-ubyte, t10k-images-idx3-ubyte \(neither"):
        check_environment(params, tmp_path, mirror)
    # The verified data set in place: download will not run, so a broken mirror is no reason to stop.
    raw = tmp_path / "data" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    (raw.parent / "manifest.json").write_text("{}")
    for name in MNIST_FILES:
        (raw / name).write_bytes(b"")
    check_environment(params, tmp_path, mirror)
    assert not (tmp_path / "models").exists()  # judged, not created: DVC's outputs stay as they are
    assert set(MNIST_FILES) == set(MNIST_SHA256) == set(MNIST_BYTES)  # one list of the files, checked by all


@pytest.mark.slow
def test_dvc_repro_stops_at_validate_before_deleting_any_output(guarded: Path, mnist_mirror: Path) -> None:
    """More training images than MNIST has: `validate` (run by every `dvc repro`) refuses before DVC deletes the
    train stage's outputs, where train itself used to refuse only after DVC had removed them."""
    before = _workspace(guarded)
    params = read_params(guarded)
    params["train"]["train_samples"] = 70_000
    write_params(guarded, params)
    try:
        result = run_command(["dvc", "repro"], guarded, stage_environment(mnist_mirror))
        assert result.returncode != 0
        assert "`train.train_samples` is 70,000, but the MNIST train split has 60,000 images" in result.stderr
        assert "Traceback" not in result.stderr
        after = _workspace(guarded)
        assert {name: digest for name, digest in after.items() if name in OUTPUTS} == {
            name: digest for name, digest in before.items() if name in OUTPUTS
        }
        assert all((guarded / name).exists() for name in OUTPUTS)
    finally:
        subprocess.run(["git", "checkout", "-q", "params.yaml"], cwd=guarded, check=True)
