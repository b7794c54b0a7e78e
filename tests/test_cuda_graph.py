"""Training steps replayed from CUDA graphs: the rules everywhere, the real thing where a GPU is.

The policy (warm-up, one capture per batch shape, every batch trained once), the lr tensor, the
resolution of `train.execution` / `train.precision` and the logged model run on any machine; the tests
marked `cuda` train on real MNIST with real graphs and skip without a GPU.
"""

from __future__ import annotations

import dataclasses
import io
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import mlflow
import numpy as np
import pytest
import torch
from mlflow import MlflowClient

from pipeline.common.errors import PipelineError
from pipeline.data.mnist import fetch_mnist, load_split, write_dataset
from pipeline.data.tensors import first_samples, to_device_data
from pipeline.model.checkpoint import checkpoint_payload, load_checkpoint, save_checkpoint
from pipeline.model.network import LabNet
from pipeline.params.parsing import params_from_mapping
from pipeline.params.schema import Precision, ProfileMode, TrackingConfig, TrainConfig, section_as_dict
from pipeline.profiling.run import prepare_profiles, run_device_profile, timing_spec
from pipeline.records.profile import Combination, read_record, write_record
from pipeline.records.wording import operators_markdown
from pipeline.tracking.lifecycle import open_tracker
from pipeline.training.artifacts import (
    REGISTERED_MODEL_DESCRIPTION,
    log_model,
    register_model,
    serving_device,
    version_facts,
)
from pipeline.training.cuda_graph import GraphLearningRate, ShapeGraphs, make_graphable_step, time_graph_replays
from pipeline.training.execution import (
    BF16_MARGIN,
    choose_precision,
    decide_from_timings,
    measure_step_ms,
    resolve_execution,
)
from pipeline.training.loop import EpochRecord, TrainingResult, evaluate, train_model
from pipeline.training.runtime import Ran, RuntimeSettings, pin_runtime, select_precision
from tests.helpers.data import LAB_MODEL
from tests.helpers.records import make_record
from tests.helpers.repo import REPO_PARAMS
from tests.helpers.stores import empty_store

CPU = torch.device("cpu")
CUDA = torch.device("cuda")
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _never(precision: str) -> float:
    raise AssertionError("measured where no measurement is needed")


# --- resolution of train.execution and train.precision -------------------------------------------------


def test_execution_auto_is_cuda_graph_on_cuda_and_eager_elsewhere() -> None:
    assert resolve_execution("auto", CUDA) == "cuda_graph"
    assert resolve_execution("auto", CPU) == "eager"
    assert resolve_execution("auto", torch.device("mps")) == "eager"
    assert resolve_execution("eager", CUDA) == "eager"
    assert resolve_execution("cuda_graph", CUDA) == "cuda_graph"
    with pytest.raises(
        PipelineError, match=r"`train.execution` is 'cuda_graph' but training runs on 'cpu'.*`train.execution: auto`"
    ):
        resolve_execution("cuda_graph", CPU)


def test_precision_auto_off_cuda_keeps_the_native_bf16_rule_and_says_so() -> None:
    choice = choose_precision("auto", CPU, "eager", _never)
    assert choice.precision == select_precision("auto", CPU)
    assert choice.reason.startswith("auto on cpu: this device ")
    assert ("natively" in choice.reason) == (choice.precision == "bf16")
    assert choose_precision("fp32", CUDA, "cuda_graph", _never).as_params() == {
        "precision": "fp32",
        "precision_reason": "set in params.yaml",
    }


@pytest.mark.parametrize(
    ("bf16_ms", "expected"),
    [(0.80, "bf16"), (1.0 - BF16_MARGIN, "bf16"), (0.97, "fp32"), (1.0, "fp32"), (1.30, "fp32")],
)
def test_precision_from_timings_needs_a_clear_bf16_win(bf16_ms: float, expected: str) -> None:
    choice = decide_from_timings({"fp32": 1.0, "bf16": bf16_ms}, "cuda_graph")
    assert choice.precision == expected
    assert choice.reason == (
        f"auto on cuda, cuda_graph: measured 1.000 ms/step fp32, {bf16_ms:.3f} bf16 "
        f"(bf16 only if >= 5% faster) -> {expected}"
    )


# --- the graph policy, with the CUDA calls replaced by their CPU equivalents ----------------------------


class _CpuShapeGraphs(ShapeGraphs):
    """ShapeGraphs whose 'graph' re-runs the step on the static buffers, as a replay re-runs its kernels."""

    def __init__(self, step: Callable[..., object]) -> None:
        super().__init__(step)
        self.captures: list[tuple[tuple[int, ...], ...]] = []

    def _run_eagerly(self, inputs: tuple[torch.Tensor, ...]) -> None:
        self._step(*inputs)

    def _capture(self, inputs: tuple[torch.Tensor, ...]) -> tuple[tuple[torch.Tensor, ...], Callable[[], None]]:
        buffers = tuple(tensor.clone() for tensor in inputs)
        self.captures.append(tuple(tuple(tensor.shape) for tensor in inputs))

        def replay() -> None:
            self._step(*buffers)

        return buffers, replay  # a capture records the step; it does not run it


def test_each_batch_shape_is_captured_once_after_warm_up_and_every_batch_is_trained() -> None:
    trained: list[float] = []
    graphs = _CpuShapeGraphs(lambda images, labels: trained.append(float(images.sum() + labels.sum())))
    generator = torch.Generator().manual_seed(0)
    replayed: list[list[bool]] = []
    expected: list[float] = []
    for _epoch in range(4):  # 5 full batches of 4 and a last batch of 2, as 22 samples in batches of 4
        data, labels = torch.rand(22, 1, 3, 3, generator=generator), torch.randint(0, 10, (22,), generator=generator)
        flags = []
        for start in range(0, 22, 4):
            batch = (data[start : start + 4], labels[start : start + 4])
            expected.append(float(batch[0].sum() + batch[1].sum()))
            flags.append(graphs(*batch))
        replayed.append(flags)
    assert trained == pytest.approx(expected, rel=1e-6)  # each batch once, replays on the copied data
    assert replayed[0] == [False, False, False, True, True, False]  # 3 warm-ups, capture, replays; last batch eager
    assert replayed[1] == replayed[2] == [True] * 5 + [False]
    assert replayed[3] == [True] * 6  # the last batch's own graph, after its 3 warm-ups
    assert graphs.captures == [((4, 1, 3, 3), (4,)), ((2, 1, 3, 3), (2,))]
    assert graphs.captured_shapes == graphs.captures


def test_graph_learning_rate_follows_the_scheduler_and_leaves_the_group_a_float() -> None:
    weight = torch.nn.Parameter(torch.ones(3))
    optimizer = torch.optim.Adadelta([weight], lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
    lr = GraphLearningRate(optimizer, CPU)
    assert lr.tensor.item() == 1.0
    for expected in (0.5, 0.25):
        scheduler.step()
        lr.refresh()
        assert lr.tensor.item() == expected
        assert optimizer.param_groups[0]["lr"] == expected
    with lr.capturing():  # not capturing: eager steps keep the float
        assert optimizer.param_groups[0]["lr"] == 0.25


# --- the logged MLflow model loads and predicts where it was logged --------------------------------------


@pytest.mark.slow  # an MLflow model logged and loaded in process: seconds
def test_logged_model_loads_and_predicts_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.delenv("MLFLOW_DEFAULT_PREDICTION_DEVICE", raising=False)
    empty_store(tmp_path)
    torch.manual_seed(0)
    model = LabNet(LAB_MODEL).eval()
    with open_tracker(
        "train",
        TrackingConfig(experiment="log-model", tensorboard_dir="runs", registered_model="lab-model"),
        root=tmp_path,
    ) as tracker:
        tracker.log_metrics({"loss": 0.25}, step=3, prefix="train/")
        tracker.set_tags({"model.digest": "abc123", "data.digest": "d1g35t"})
        result = TrainingResult(model, epochs=[EpochRecord(1, 1.0, 0.25, 0.9, 0.75, 0.5)], optimizer_steps=3)
        model_uri = log_model(tracker, result, ("mnist-test", "0123abcd"))
        assert not MlflowClient().search_model_versions("name = 'lab-model'")  # logged, not yet registered
        description, tags = version_facts(
            {"test_accuracy": 0.98765, "test_loss": 0.04321, "epochs": 2},
            {"lr": 1.0, "gamma": 0.7, "batch_size": 64, "seed": 1},
            Ran(RuntimeSettings("cpu", "bf16", threads=2, seed=1, deterministic=True), "eager"),
            2_000,
        )
        version = register_model(tracker, model_uri, "lab-model", description, tags)
        run_id = tracker.run_id
    mlflow.set_tracking_uri(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run = MlflowClient().get_run(run_id)
    assert run.data.tags["model.serving_device"] == str(serving_device())
    (logged,) = mlflow.search_logged_models(experiment_ids=[run.info.experiment_id], output_format="list")
    assert logged.model_id == run.data.tags["model.id"] and str(logged.status) == "READY"
    # The run's metrics at the model's step are linked to it (MLflow shows them on the model's page), the final
    # test metrics (logged with the model) on their dataset's row.
    linked = sorted((m.key, m.value, m.step, m.dataset_name, m.dataset_digest) for m in logged.metrics)
    assert linked == [
        ("test/accuracy", 0.5, 3, "mnist-test", "0123abcd"),
        ("test/loss", 0.75, 3, "mnist-test", "0123abcd"),
        ("train/loss", 0.25, 3, None, None),
    ]
    model_id = logged.model_id
    # Registered: a version of the named model per logged model, pointing back at this run and model.
    (registered,) = MlflowClient().search_model_versions("name = 'lab-model'")
    assert version == f"lab-model/{registered.version}" == run.data.tags["model.registered_version"]
    assert registered.run_id == run_id and registered.source == f"models:/{model_id}" == model_uri
    # Described and tagged: the Models page tells versions apart without opening their runs.
    assert registered.description.startswith("Test accuracy **0.9877**, loss 0.0432 on mnist-test (2,000 images)")
    assert "bf16 on cpu (eager, 2 thread(s))" in registered.description
    assert registered.tags == {
        "test_accuracy": "0.9877",
        "test_loss": "0.0432",
        "test_images": "2000",
        "epochs": "2",
        "train.device": "cpu",
        "train.precision": "bf16",
        "train.execution": "eager",
        "train.threads": "2",
        "model.digest": "abc123",
        "data.digest": "d1g35t",
        "machine.name": run.data.tags["machine.name"],
    }
    assert MlflowClient().get_registered_model("lab-model").description == REGISTERED_MODEL_DESCRIPTION
    images = torch.randn(5, 1, 28, 28)
    with torch.no_grad():
        expected = model(images).numpy()
    served = mlflow.pyfunc.load_model(f"models:/{logged.model_id}")  # on cuda where there is one, as MLflow chooses
    predicted = np.asarray(served.predict(images.numpy()))
    assert predicted.shape == (5, 10)
    # TF32 convolutions on a GPU: equal to a few 1e-4 there, to float rounding on the CPU.
    np.testing.assert_allclose(predicted, expected, atol=1e-5 if serving_device().type == "cpu" else 2e-3)
    monkeypatch.setenv("MLFLOW_DEFAULT_PREDICTION_DEVICE", "cpu")
    assert serving_device() == CPU


# --- the profile record's graph timing (host overhead) ---------------------------------------------------


def test_host_overhead_is_eager_minus_graph_median_and_only_where_a_graph_ran(tmp_path: Path) -> None:
    cpu = make_record(16, "cpu", "train", 4.0)
    assert cpu.graph_metrics() == {}
    assert "CUDA graph" not in operators_markdown(cpu)
    gpu = dataclasses.replace(make_record(16, "cuda", "train", 4.0), graph_step_times_ms=(0.9, 1.0, 5.0))
    assert gpu.graph_metrics() == {"graph_step_time_ms_median": 1.0, "host_overhead_ms": 3.0, "host_overhead_pct": 75.0}
    assert "replayed from a CUDA graph: 1.000 ms median. Host overhead (eager - graph medians): 3.000 ms, 75 %" in (
        operators_markdown(gpu)
    )
    path = tmp_path / "profile.json"
    path.write_text(write_record(gpu))
    assert read_record(path, gpu.combination) == gpu
    older = cpu.as_dict()
    del older["graph_step_times_ms"]  # a record written before graph timing existed still reads
    path.write_text(json.dumps(older))
    assert read_record(path, cpu.combination) == cpu


# --- real graphs on a GPU ---------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def mnist_root(mnist_mirror: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("data")
    write_dataset(fetch_mnist(params_from_mapping(REPO_PARAMS).data, [str(mnist_mirror)]), root)
    return root


@pytest.fixture
def graph_train(repo_params: dict[str, Any]) -> TrainConfig:
    config = params_from_mapping(repo_params).train
    return dataclasses.replace(config, epochs=1, train_samples=2000, log_every_steps=5, device="cuda", precision="fp32")


def _train_on_cuda(
    config: TrainConfig, root: Path, execution: str = "cuda_graph", test_samples: int = 2000
) -> TrainingResult:
    pin_runtime(CUDA, config.precision, config.threads, config.seed)
    train = to_device_data(*first_samples(*load_split(root, "train"), config.train_samples), CUDA)
    test = to_device_data(*first_samples(*load_split(root, "test"), test_samples), CUDA)
    return train_model(config, train, test, CUDA, config.precision, progress=False, execution=execution)


def _weights(model: torch.nn.Module) -> bytes:
    buffer = io.BytesIO()
    torch.save({name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}, buffer)
    return buffer.getvalue()


@cuda
def test_real_graphs_replay_the_copied_inputs_per_shape() -> None:
    total = torch.zeros((), device=CUDA, dtype=torch.float64)
    graphs = ShapeGraphs(lambda values: total.add_(values.double().square().sum()))
    batches = [torch.rand(n, device=CUDA) for n in [8] * 6 + [3] * 4]
    flags = [graphs(batch) for batch in batches]
    assert flags == [False] * 3 + [True] * 3 + [False] * 3 + [True]
    assert total.item() == pytest.approx(sum(float(batch.double().square().sum()) for batch in batches), rel=1e-12)
    assert graphs.captured_shapes == [((8,),), ((3,),)]


@cuda
def test_graph_training_trains_every_batch_and_reruns_bit_identically(
    graph_train: TrainConfig, mnist_root: Path
) -> None:
    first = _train_on_cuda(graph_train, mnist_root)
    (epoch,) = first.epochs
    assert epoch.test_accuracy > 0.6  # it learns (chance: 0.1); accuracy vs eager: the seed-noise test below
    assert first.optimizer_steps == 32  # ceil(2000 / 64): the partial batch too
    assert [record.step for record in first.steps] == [5, 10, 15, 20, 25, 30, 32]
    windows = [5 * 64] * 6 + [64 + (2000 - 31 * 64)]
    weighted = sum(record.train_loss * size for record, size in zip(first.steps, windows, strict=True)) / 2000
    assert epoch.train_loss == pytest.approx(weighted, rel=1e-9)
    second = _train_on_cuda(graph_train, mnist_root)
    assert second.epochs == first.epochs
    assert second.steps == first.steps
    assert _weights(second.model) == _weights(first.model)
    assert _weights(_train_on_cuda(dataclasses.replace(graph_train, seed=2), mnist_root).model) != _weights(first.model)


@cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_the_per_epoch_lr_decay_reaches_the_replayed_optimizer(
    graph_train: TrainConfig, mnist_root: Path, precision: Precision
) -> None:
    # gamma 0: the second epoch trains with lr 0, so its replays must leave the weights as they were.
    frozen = dataclasses.replace(graph_train, gamma=0.0, precision=precision)
    one = _train_on_cuda(frozen, mnist_root)
    two = _train_on_cuda(dataclasses.replace(frozen, epochs=2), mnist_root)
    assert [record.lr for record in two.epochs] == [1.0, 0.0]
    assert _weights(two.model) == _weights(one.model)
    decayed = _train_on_cuda(dataclasses.replace(graph_train, epochs=2, precision=precision), mnist_root)
    assert _weights(decayed.model) != _weights(one.model)


@cuda
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_at_lr_one_in_fp32_a_replayed_epoch_is_the_eager_epoch_bit_for_bit(
    graph_train: TrainConfig, mnist_root: Path, seed: int
) -> None:
    # Same kernels, same dropout draws (a replay advances the generator as the eager kernels do), and at
    # lr 1.0 the capturable update (delta * -lr, then add) rounds exactly as the eager one (add with
    # alpha -lr): the graph changes when the step is launched, not what it computes.
    config = dataclasses.replace(graph_train, seed=seed)
    eager, graph = _train_on_cuda(config, mnist_root, "eager"), _train_on_cuda(config, mnist_root)
    assert _weights(graph.model) == _weights(eager.model)
    assert graph.steps == eager.steps


@cuda
def test_graph_and_eager_training_agree_within_seed_noise(graph_train: TrainConfig, mnist_root: Path) -> None:
    accuracies: dict[str, list[float]] = {"eager": [], "cuda_graph": []}
    for seed in (1, 2, 3):
        config = dataclasses.replace(graph_train, train_samples=12_800, seed=seed)
        for execution in accuracies:
            accuracies[execution].append(_train_on_cuda(config, mnist_root, execution, 10_000).epochs[-1].test_accuracy)
    print(accuracies)
    spread = max(max(runs) - min(runs) for runs in accuracies.values())
    assert min(min(runs) for runs in accuracies.values()) > 0.93
    # Seed noise of one epoch on 12,800 images is a few 0.1 %: the two means must be that close.
    assert abs(np.mean(accuracies["eager"]) - np.mean(accuracies["cuda_graph"])) <= max(0.005, 2 * spread)


@cuda
def test_checkpoint_of_graph_training_loads_on_the_cpu(
    graph_train: TrainConfig, mnist_root: Path, tmp_path: Path
) -> None:
    result = _train_on_cuda(graph_train, mnist_root)
    path = tmp_path / "model.pt"
    runtime = {"device": "cuda", "execution": "cuda_graph"}
    save_checkpoint(checkpoint_payload(result.model, section_as_dict(graph_train), "digest", runtime, {}), path)
    loaded = load_checkpoint(path)
    assert all(tensor.device == CPU for tensor in loaded.model.state_dict().values())
    test = first_samples(*load_split(mnist_root, "test"), 2000)
    _, on_cpu = evaluate(loaded.model, to_device_data(*test, CPU), 1000)
    _, on_gpu = evaluate(result.model, to_device_data(*test, CUDA), 1000)
    assert abs(on_cpu - on_gpu) <= 2 / 2000  # TF32 convolutions on the GPU may flip a borderline image


@cuda
@pytest.mark.parametrize("mode", ["inference", "train"])
def test_replayed_profile_step_is_timed_and_does_the_step(mode: str) -> None:
    torch.manual_seed(0)
    model = LabNet(LAB_MODEL).to(CUDA)
    images, labels = torch.randn(16, 1, 28, 28, device=CUDA), torch.randint(0, 10, (16,), device=CUDA)
    before = _weights(model)
    times = time_graph_replays(
        make_graphable_step(model, mode, images, labels, lr=1.0), warmup_steps=3, active_steps=20
    )
    assert len(times) == 20
    assert all(time > 0 for time in times)
    assert (_weights(model) != before) == (mode == "train")  # replays update the weights in training only


@cuda
def test_precision_auto_on_cuda_is_measured_and_recorded(graph_train: TrainConfig, mnist_root: Path) -> None:
    train = to_device_data(*first_samples(*load_split(mnist_root, "train"), 8192), CUDA)
    for execution in ("eager", "cuda_graph"):
        choice = choose_precision("auto", CUDA, execution, measure_step_ms(graph_train, train, CUDA, execution))
        assert choice.precision in ("fp32", "bf16")
        assert choice.reason.startswith(f"auto on cuda, {execution}: measured ")
        assert "ms/step fp32" in choice.reason
        print(choice.reason)


MODES: tuple[ProfileMode, ...] = ("inference", "train")


@cuda
def test_profile_of_a_cuda_combination_times_the_graph_replay_too(mnist_root: Path, tmp_path: Path) -> None:
    torch.manual_seed(0)
    checkpoint = tmp_path / "model.pt"
    save_checkpoint(checkpoint_payload(LabNet(LAB_MODEL), {"lr": 1.0}, "digest", {}, {}), checkpoint)
    config = dataclasses.replace(
        params_from_mapping(REPO_PARAMS).profile, warmup_steps=3, active_steps=6, processes=2, time_budget_s=1.0
    )
    setups = prepare_profiles([Combination(16, "cuda", mode) for mode in MODES], config, checkpoint, mnist_root)
    spec = timing_spec(setups, config, checkpoint, mnist_root)
    traces = [tmp_path / f"{mode}.json.gz" for mode in MODES]
    records, comparisons = run_device_profile(setups, spec, config.processes, config.top_k, traces)
    # The paired comparison runs on the GPU too: a training step against an inference step, per step, 2 processes.
    (per_step,) = comparisons.comparisons
    assert (per_step.numerator, per_step.per, len(per_step.process_values)) == ("16-cuda-train", "step", 2)
    assert per_step.value > 1 and len(comparisons.process_speeds) == 2
    for record in records:
        assert record.trace_check is not None and record.trace_check.attempts >= 1
        assert len(record.graph_step_times_ms) == 6
        assert all(time > 0 for time in record.graph_step_times_ms)
        metrics = record.graph_metrics()
        assert metrics["host_overhead_ms"] == pytest.approx(
            record.timing.step_time_ms_median - metrics["graph_step_time_ms_median"]
        )
        assert "replayed from a CUDA graph" in operators_markdown(record)
        print(operators_markdown(record).splitlines()[4])
