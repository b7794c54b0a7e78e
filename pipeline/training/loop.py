"""The lab's training recipe (Adadelta + StepLR, NLL loss) fed from tensors held on the device.

Speed: the whole of MNIST is one normalized float tensor on the device (188 MB), shuffled once per
epoch and sliced into batches — no DataLoader, no per-item PIL transforms, which alone cost more per image than
the model's forward pass at batch 64 on two cores (docs/measurements.md).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from tqdm import tqdm

from pipeline.common.interrupts import pause_at
from pipeline.data.tensors import MEMORY_FORMAT, DeviceData
from pipeline.model.network import LabNet
from pipeline.params.schema import TrainConfig
from pipeline.tracking.tracker import Tracker
from pipeline.training.cuda_graph import GraphLearningRate, ShapeGraphs, capturable_adadelta


@dataclass(frozen=True)
class StepRecord:
    step: int  # optimizer steps done so far
    epoch: int
    train_loss: float  # mean over the samples seen since the previous record
    train_accuracy: float


@dataclass(frozen=True)
class EpochRecord:
    epoch: int
    lr: float  # the rate this epoch trained with
    train_loss: float  # mean over every sample of the epoch
    train_accuracy: float
    test_loss: float
    test_accuracy: float


@dataclass
class TrainingResult:
    model: LabNet
    steps: list[StepRecord] = field(default_factory=list)
    epochs: list[EpochRecord] = field(default_factory=list)
    train_seconds: float = 0.0  # optimizer steps only, evaluation excluded
    epoch_seconds: list[float] = field(default_factory=list)  # the same, per epoch
    cpu_seconds: float = 0.0  # this process's CPU time (all its threads, user + system) over `train_seconds`
    train_samples: int = 0
    optimizer_steps: int = 0

    @property
    def images_per_second(self) -> float:
        return self.train_samples / self.train_seconds if self.train_seconds else 0.0

    def cpu_share(self, threads: int) -> float:
        """How much of `threads` CPUs the training got while it ran: CPU time ÷ (wall time × threads). Near 1 on an
        idle machine (the intra-op threads compute or spin); well below when other processes held the cores."""
        return self.cpu_seconds / (self.train_seconds * threads) if self.train_seconds and threads else 0.0


def build_model(config: TrainConfig, device: torch.device) -> LabNet:
    return LabNet(config.model).to(device).to(memory_format=MEMORY_FORMAT)


def train_model(
    config: TrainConfig,
    train: DeviceData,
    test: DeviceData,
    device: torch.device,
    precision: str = "fp32",
    tracker: Tracker | None = None,
    progress: bool = True,
    execution: str = "eager",
    log_final_test: bool = True,
) -> TrainingResult:
    """Train from a freshly seeded model; log per-step and per-epoch metrics to `tracker` if given. With
    `log_final_test` False the last epoch's test metrics are left to the caller (`result.epochs[-1]`): the train
    stage logs them with the model and the test dataset they describe (training.artifacts.log_model).

    The caller seeds the generators first (runtime.pin_runtime); the shuffling generator below is
    seeded from `config.seed` as well, so the order of batches never depends on anything else.
    `execution` is resolved already (pipeline.training.execution): "eager", or "cuda_graph" on a CUDA device.
    """
    model = build_model(config, device)
    graphed = execution == "cuda_graph"
    optimizer = (
        capturable_adadelta(model, config.lr) if graphed else torch.optim.Adadelta(model.parameters(), lr=config.lr)
    )
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=config.gamma)
    shuffler = torch.Generator().manual_seed(config.seed)
    result = TrainingResult(model=model)
    # Sums stay on the device between records: reading them every step would force a GPU sync. One pair
    # for the whole run: a captured step adds into these very tensors.
    window = Window(
        loss=torch.zeros((), device=device, dtype=torch.float64),
        correct=torch.zeros((), device=device, dtype=torch.int64),
    )
    step = _step_function(model, optimizer, precision, window, graphed)
    epochs = tqdm(range(1, config.epochs + 1), desc="epochs", unit="epoch", disable=not progress)
    for epoch in epochs:
        lr = optimizer.param_groups[0]["lr"]
        started, cpu_started = time.perf_counter(), time.process_time()
        train_loss, train_accuracy = train_epoch(
            step, window, train, config, epoch, shuffler, result, tracker, progress
        )
        result.epoch_seconds.append(time.perf_counter() - started)
        result.cpu_seconds += time.process_time() - cpu_started
        result.train_seconds += result.epoch_seconds[-1]
        result.train_samples += len(train)
        scheduler.step()
        test_loss, test_accuracy = evaluate(model, test, config.test_batch_size)
        record = EpochRecord(epoch, lr, train_loss, train_accuracy, test_loss, test_accuracy)
        result.epochs.append(record)
        epochs.set_postfix(test_accuracy=f"{test_accuracy:.4f}", test_loss=f"{test_loss:.4f}")
        if tracker is not None:
            # At the optimizer step the epoch ended on, the x axis of the train/* curves: MLflow and TensorBoard
            # overlay test on train only when both count the same steps.
            step_reached = result.optimizer_steps
            tracker.log_metrics(
                {
                    "lr": lr,
                    "epoch_loss": train_loss,
                    "epoch_accuracy": train_accuracy,
                    "epoch_seconds": result.epoch_seconds[-1],
                    "images_per_second": len(train) / result.epoch_seconds[-1],
                },
                step=step_reached,
                prefix="train/",
            )
            if log_final_test or epoch < config.epochs:
                tracker.log_metrics({"loss": test_loss, "accuracy": test_accuracy}, step=step_reached, prefix="test/")
    if tracker is not None:
        tracker.flush()  # the step metrics in the store before training returns (a logged model links the latest)
    return result


@dataclass(frozen=True)
class Window:
    """The loss and correct predictions summed on the device since the last logged step (no sync per step)."""

    loss: torch.Tensor  # float64 sum of per-sample losses since the last record
    correct: torch.Tensor  # int64 count of correct predictions since the last record


StepFunction = Callable[[torch.Tensor, torch.Tensor], None]


def _step_function(
    model: LabNet, optimizer: torch.optim.Optimizer, precision: str, window: Window, graphed: bool
) -> StepFunction:
    """One optimizer step on a batch, adding its loss and correct count to `window`.

    Eager: the step itself. Graphed: the same step run by ShapeGraphs (eager warm-up, then a graph per
    batch shape), with the per-epoch lr read from a device tensor.
    """

    def step(images: torch.Tensor, labels: torch.Tensor) -> None:
        optimizer.zero_grad(set_to_none=True)
        # Autocast's weight-cast cache must be off while capturing (PyTorch CUDA Graphs docs).
        with torch.autocast(
            images.device.type, dtype=torch.bfloat16, enabled=precision == "bf16", cache_enabled=not graphed
        ):
            log_probabilities = model(images)
        loss = F.nll_loss(log_probabilities.float(), labels)  # mean over the batch, in fp32
        loss.backward()  # type: ignore[no-untyped-call]
        optimizer.step()
        window.loss.add_(loss.detach() * labels.shape[0])  # back to a sum: the last batch may be smaller
        window.correct.add_((log_probabilities.detach().argmax(dim=1) == labels).sum())

    if not graphed:
        return step
    lr = GraphLearningRate(optimizer, window.loss.device)

    def captured_step(images: torch.Tensor, labels: torch.Tensor) -> None:
        with lr.capturing():
            step(images, labels)

    graphs = ShapeGraphs(captured_step)

    def replayed_step(images: torch.Tensor, labels: torch.Tensor) -> None:
        lr.refresh()
        graphs(images, labels)

    return replayed_step


def _batches(
    data: DeviceData, batch_size: int, order: torch.Tensor | None = None
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    images, labels = data.images, data.labels
    if order is not None:
        # One gather per epoch, then contiguous slices: cheaper than gathering every batch.
        images, labels = images[order].contiguous(memory_format=MEMORY_FORMAT), labels[order]
    for start in range(0, len(data), batch_size):
        yield images[start : start + batch_size], labels[start : start + batch_size]


def train_epoch(
    step: StepFunction,
    window: Window,
    data: DeviceData,
    config: TrainConfig,
    epoch: int,
    shuffler: torch.Generator,
    result: TrainingResult,
    tracker: Tracker | None,
    progress: bool,
) -> tuple[float, float]:
    """One epoch of `step` over `data` in shuffled batches; every `log_every_steps` a StepRecord (and the
    tracker's step metrics). Returns the epoch's mean loss and accuracy."""
    result.model.train()
    order = torch.randperm(len(data), generator=shuffler).to(data.labels.device)
    window_samples = epoch_samples = 0
    epoch_loss = epoch_correct = 0.0
    steps = (len(data) + config.batch_size - 1) // config.batch_size
    bar = tqdm(
        _batches(data, config.batch_size, order),
        total=steps,
        desc=f"epoch {epoch}",
        unit="batch",
        leave=False,
        disable=not progress,
        mininterval=1.0,
    )
    for index, (images, labels) in enumerate(bar, start=1):
        step(images, labels)
        result.optimizer_steps += 1
        window_samples += labels.shape[0]
        if index % config.log_every_steps == 0 or index == steps:
            loss_sum, correct = window.loss.item(), int(window.correct.item())
            record = StepRecord(result.optimizer_steps, epoch, loss_sum / window_samples, correct / window_samples)
            result.steps.append(record)
            epoch_loss += loss_sum
            epoch_correct += correct
            epoch_samples += window_samples
            if tracker is not None:
                tracker.log_step_metrics(
                    {
                        "train/loss": record.train_loss,
                        "train/accuracy": record.train_accuracy,
                        "train/epoch": epoch - 1 + index / steps,  # fractional: an x axis in epochs, if preferred
                    },
                    step=record.step,
                )
            bar.set_postfix(loss=f"{record.train_loss:.4f}")
            pause_at("training")  # once per log window, not per step: pipeline.common.interrupts
            window.loss.zero_()
            window.correct.zero_()
            window_samples = 0
    return epoch_loss / epoch_samples, epoch_correct / epoch_samples


@torch.no_grad()
def evaluate(model: LabNet, data: DeviceData, batch_size: int) -> tuple[float, float]:
    """Mean NLL loss and accuracy over every sample of `data`, always in fp32: the numbers later
    stages (graph export, profiling) reproduce from the checkpoint."""
    model.eval()
    loss_sum = torch.zeros((), device=data.labels.device, dtype=torch.float64)
    correct = torch.zeros((), device=data.labels.device, dtype=torch.int64)
    for images, labels in _batches(data, batch_size):
        log_probabilities = model(images)
        loss_sum += F.nll_loss(log_probabilities, labels, reduction="sum")
        correct += (log_probabilities.argmax(dim=1) == labels).sum()
    return loss_sum.item() / len(data), correct.item() / len(data)
