"""Training speed as a user gets it: this pipeline's loop vs the pytorch/examples MNIST recipe, each in fresh processes.

    python -m benchmarks.train_speed [--samples 60000] [--test-samples 10000] [--repeats 3] [--device cpu|cuda]
                                     [--epochs 1] [--no-stage] [--variant NAME ...]

Every variant trains `--epochs` epochs (default 1) over the first `--samples` training images in a process of its
own, started for that one run, as every DVC stage is (a warm process that has trained before runs faster: glibc
has raised its thresholds; pipeline.common.allocator). One repeat runs each variant once, in a rotated order, so
that the variants of one repeat share a window of the machine's time; a ratio is taken within a repeat (paired),
and the table gives the median over repeats with the min-max spread. Variants (CPU):

- `reference`: pytorch/examples mnist/main.py's way of feeding batches (torchvision dataset, ToTensor +
  Normalize per item, DataLoader with shuffle; on CUDA `num_workers=1, pin_memory=True`), same network
  (pipeline.model.network.LabNet), optimizer and thread count;
- `pipeline`: the train stage's loop (`train.precision` resolved as the stage resolves it, the allocator tuned
  as the stage tunes it; the reference keeps glibc's defaults, as its users get them), no tracking;
  `pipeline fp32` where that resolves to another precision;
- `pipeline+tracking`: the same loop logging to MLflow + TensorBoard in a throw-away store;
- `train stage`: `python -m stages.train` itself in a scratch copy of the project (the same epochs and
  samples), its images/s read from the `metrics/train_speed.json` it writes, or with `--epochs` > 1 from the
  `train/epoch_seconds` it logs to its MLflow store (`--no-stage` skips it).

With one epoch, images/s is that epoch's, as the stage reports it. With `--epochs` N > 1 it is over epochs 2..N
(steady state): the first pays one-off costs, which on a GPU are most of a short epoch (the warm-up steps, the
graph capture, the first use of cuBLAS and cuDNN: on an NVIDIA H200 a one-epoch run of `cuda_graph bf16` gave far
fewer images/s than the stage, which pays them in its precision measurement before it times an epoch:
docs/measurements.md). On CUDA use `--epochs 3`. The table also gives the minor page faults per epoch, over all
epochs trained (`benchmarks.allocator` compares allocators). On CUDA: eager and CUDA-graph-replayed
(`train.execution`), each in fp32 and bf16, and the graph with tracking. Needs `dvc repro download` (or MNIST in
data/) first. Writes nothing in the project. `--variant NAME` (repeatable) runs only the named variants, for
example `--variant "cuda_graph bf16" --variant "cuda_graph bf16+tracking"` for what tracking costs alone; the
ratio column is then against the first one named.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import yaml

from pipeline.common.allocator import tune_allocator
from pipeline.common.paths import DATA_ROOT, TRAIN_SPEED
from pipeline.devices.registry import device_kind, device_names, host_kind
from pipeline.params.loading import load_params
from pipeline.params.schema import TrainConfig

EPOCH_SECONDS_LIMIT = 3600  # one worker; a hung one must not hang the benchmark
TEST_IMAGES = 10_000  # MNIST's test set


def steady_speed(samples: int, epoch_seconds: Sequence[float]) -> float:
    """Images per second of `samples`-image epochs: the only epoch's, or over all epochs after the first."""
    timed = epoch_seconds[1:] if len(epoch_seconds) > 1 else epoch_seconds
    return samples * len(timed) / sum(timed)


def reference_epoch(
    config: TrainConfig, samples: int, seed: int, device_name: str, test_samples: int, epochs: int = 1
) -> tuple[float, float, float]:
    """pytorch/examples mnist, `epochs` epochs: (images per second (`steady_speed`), test accuracy after the
    last epoch, minor page faults per epoch while training)."""
    import torch
    import torch.nn.functional as F
    from torch.utils.data import DataLoader, Subset
    from torchvision import datasets, transforms

    from pipeline.data.tensors import MNIST_MEAN, MNIST_STD
    from pipeline.model.network import LabNet
    from pipeline.training.runtime import pin_runtime, select_device

    device = select_device(device_name, param="--device")
    pin_runtime(device, "fp32", config.threads, seed)
    transform = transforms.Compose([transforms.ToTensor(), transforms.Normalize((MNIST_MEAN,), (MNIST_STD,))])
    train_set = Subset(datasets.MNIST(str(DATA_ROOT), train=True, download=False, transform=transform), range(samples))
    test_set = Subset(
        datasets.MNIST(str(DATA_ROOT), train=False, download=False, transform=transform), range(test_samples)
    )
    on_gpu = device.type == "cuda"  # the example's `cuda_kwargs`: one loader worker and pinned host memory
    train_loader = DataLoader(train_set, batch_size=64, shuffle=True, num_workers=int(on_gpu), pin_memory=on_gpu)
    test_loader = DataLoader(test_set, batch_size=1000, num_workers=int(on_gpu), pin_memory=on_gpu)
    model = LabNet(config.model).to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=config.gamma)  # the example's
    model.train()
    faults = minor_faults()
    seconds: list[float] = []
    for _ in range(epochs):
        started = time.perf_counter()
        for batch_index, (data, target) in enumerate(train_loader):
            optimizer.zero_grad()
            loss = F.nll_loss(model(data.to(device)), target.to(device))
            loss.backward()  # type: ignore[no-untyped-call]
            optimizer.step()
            if batch_index % 10 == 0:
                loss.item()  # the example prints the loss every 10 batches: keep its sync
        if on_gpu:
            torch.cuda.synchronize(device)  # queued GPU work belongs to the epoch
        seconds.append(time.perf_counter() - started)
        scheduler.step()
    faults = minor_faults() - faults
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in test_loader:
            correct += int((model(data.to(device)).argmax(dim=1) == target.to(device)).sum().item())
    return steady_speed(samples, seconds), correct / len(test_set), faults / epochs


def pipeline_epoch(
    config: TrainConfig,
    samples: int,
    seed: int,
    device_name: str,
    precision: str,
    execution: str,
    tracked: bool,
    test_samples: int,
    epochs: int = 1,
) -> tuple[float, float, float]:
    """This pipeline's loop, `epochs` epochs: (images per second (`steady_speed` of the stage's own epoch
    seconds, `TrainingResult.epoch_seconds`), test accuracy after the last epoch, minor page faults per epoch
    during `train_model`, its per-epoch test pass included).

    With cuda_graph the first epoch's seconds include the eager warm-up steps and the capture, paid once per run.
    """
    from pipeline.data.mnist import load_split
    from pipeline.data.tensors import first_samples, to_device_data
    from pipeline.params.schema import TrackingConfig
    from pipeline.tracking.lifecycle import open_tracker
    from pipeline.training.loop import train_model
    from pipeline.training.runtime import pin_runtime, select_device, select_precision

    device = select_device(device_name, param="--device")
    precision = select_precision(precision, device)
    config = dataclasses.replace(config, epochs=epochs, train_samples=samples, seed=seed)
    pin_runtime(device, precision, config.threads, config.seed)
    train = to_device_data(*first_samples(*load_split(DATA_ROOT, "train"), samples), device)
    test = to_device_data(*first_samples(*load_split(DATA_ROOT, "test"), test_samples), device)
    faults = minor_faults()
    if not tracked:
        result = train_model(config, train, test, device, precision, tracker=None, progress=False, execution=execution)
    else:
        with tempfile.TemporaryDirectory() as scratch:
            os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{scratch}/mlflow.db"
            tracking = TrackingConfig(experiment="benchmark", tensorboard_dir="runs", registered_model="benchmark")
            with open_tracker("benchmark", tracking, root=Path(scratch)) as tracker:
                result = train_model(
                    config, train, test, device, precision, tracker, progress=False, execution=execution
                )
    faults = minor_faults() - faults
    # The last epoch's own test pass (fp32, pipeline.training.loop.evaluate), as the stage records it.
    return steady_speed(samples, result.epoch_seconds), result.epochs[-1].test_accuracy, faults / epochs


def stage_epoch(samples: int, seed: int, device_name: str, epochs: int = 1) -> tuple[float, float, float]:
    """`python -m stages.train` in a scratch copy of the project (its own MLflow store): what `dvc repro` runs.
    Images/s: the `metrics/train_speed.json` it writes, or with `epochs` > 1 `steady_speed` of the
    `train/epoch_seconds` it logged to MLflow."""
    project = Path.cwd()
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch)
        for name in ("pipeline", "stages"):
            shutil.copytree(project / name, copy / name, ignore=shutil.ignore_patterns("__pycache__"))
        (copy / DATA_ROOT).mkdir()
        (copy / DATA_ROOT / "MNIST").symlink_to((project / DATA_ROOT / "MNIST").resolve())
        params = yaml.safe_load((project / "params.yaml").read_text())
        params["train"].update(epochs=epochs, train_samples=samples, seed=seed, device=device_name)
        (copy / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        environment = {**os.environ, "MLFLOW_TRACKING_URI": f"sqlite:///{copy}/mlflow.db"}
        command = [sys.executable, "-m", "stages.train"]
        faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt
        result = subprocess.run(
            command, cwd=copy, env=environment, capture_output=True, text=True, timeout=EPOCH_SECONDS_LIMIT
        )
        faults = resource.getrusage(resource.RUSAGE_CHILDREN).ru_minflt - faults
        if result.returncode != 0:
            raise SystemExit(f"`python -m stages.train` failed:\n{result.stderr[-3000:]}")
        if epochs > 1:
            speed = steady_speed(samples, logged_epoch_seconds(environment["MLFLOW_TRACKING_URI"]))
        else:
            speed = float(json.loads((copy / TRAIN_SPEED).read_text())["images_per_second"])
        quality = json.loads((copy / "metrics" / "train.json").read_text())
    # The whole stage's faults (imports, data, tracking), per epoch: more than the loop's alone.
    return speed, float(quality["test_accuracy"]), faults / epochs


def logged_epoch_seconds(tracking_uri: str) -> list[float]:
    """`train/epoch_seconds` of the one train run in the MLflow store at `tracking_uri`, in epoch order."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri)
    experiments = [experiment.experiment_id for experiment in client.search_experiments()]
    (run,) = client.search_runs(experiments, filter_string="tags.stage = 'train'")
    history = client.get_metric_history(run.info.run_id, "train/epoch_seconds")
    return [metric.value for metric in sorted(history, key=lambda metric: metric.step)]


@dataclass(frozen=True)
class Variant:
    """One way of training that the benchmark times; `name` is how the table shows it and how its worker process
    is told which to run."""

    name: str
    recipe: Literal["reference", "pipeline", "train stage"]
    execution: str = "eager"
    precision: str | None = None  # None: train.precision
    tracked: bool = False  # the pipeline's loop with its MLflow and TensorBoard logging


def variants_for(config: TrainConfig, device_name: str, stage: bool) -> tuple[list[Variant], Variant]:
    """The variants to run and the one the headline ratio is about."""
    reference = Variant("reference", "reference")
    stage_variant = [Variant("train stage", "train stage")] if stage else []
    if device_kind(device_name).graph_capture():
        pairs = [(execution, precision) for execution in ("eager", "cuda_graph") for precision in ("fp32", "bf16")]
        graphs = [Variant(f"{e} {p}", "pipeline", e, p) for e, p in pairs]
        tracked = Variant("cuda_graph bf16+tracking", "pipeline", "cuda_graph", "bf16", tracked=True)
        return [reference, *graphs, tracked, *stage_variant], graphs[-1]
    pipeline = Variant("pipeline", "pipeline")
    fp32 = [Variant("pipeline fp32", "pipeline", precision="fp32")] if config.precision != "fp32" else []
    tracked = Variant("pipeline+tracking", "pipeline", tracked=True)
    return [reference, pipeline, *fp32, tracked, *stage_variant], pipeline


def same_loop(a: Variant, b: Variant) -> bool:
    return (a.recipe, a.execution, a.precision) == (b.recipe, b.execution, b.precision)


def select_variants(variants: list[Variant], names: list[str], parser: argparse.ArgumentParser) -> list[Variant]:
    """The variants named by --variant, in the order named; an unknown name is refused with the known ones."""
    known = {variant.name: variant for variant in variants}
    unknown = [name for name in names if name not in known]
    if unknown:
        listed = ", ".join(repr(name) for name in known)
        parser.error(f"argument --variant: {unknown[0]!r} is not a variant on this device; choose from {listed}")
    return [known[name] for name in dict.fromkeys(names)]


def worker(
    name: str, samples: int, seed: int, device_name: str, test_samples: int, epochs: int = 1
) -> tuple[float, float, float]:
    """One run of the variant `name`, in this (fresh) process: (images/s, test accuracy, minor page faults per
    epoch). The train stage variant tests on the whole test set, as the stage does."""
    config = load_params().train
    variant = next(v for v in variants_for(config, device_name, stage=True)[0] if v.name == name)
    if variant.recipe == "reference":
        return reference_epoch(
            config, samples, seed, device_name, test_samples, epochs
        )  # glibc's defaults, as its users get them
    tune_allocator()  # as every torch stage does (pipeline.common.allocator); $LAB_ALLOCATOR=default undoes it
    if variant.recipe == "train stage":
        return stage_epoch(samples, seed, device_name, epochs)
    precision = variant.precision or config.precision
    return pipeline_epoch(
        config, samples, seed, device_name, precision, variant.execution, variant.tracked, test_samples, epochs
    )


def run_worker(
    variant: str,
    samples: int,
    seed: int,
    device_name: str,
    environment: Mapping[str, str] | None = None,
    test_samples: int = TEST_IMAGES,
    epochs: int = 1,
) -> tuple[float, float, float]:
    """`variant` in a fresh process (with `environment` added to this one's); what `worker` returned."""
    command = [sys.executable, "-m", "benchmarks.train_speed", "--worker", variant]
    command += ["--samples", str(samples), "--test-samples", str(test_samples), "--seed", str(seed)]
    command += ["--epochs", str(epochs)]
    command += ["--device", device_name]
    result = subprocess.run(
        command,
        capture_output=True,
        text=True,
        check=False,
        timeout=EPOCH_SECONDS_LIMIT,
        env={**os.environ, **(environment or {})},
    )
    if result.returncode != 0:
        raise SystemExit(f"variant {variant!r} failed:\n{result.stderr[-3000:]}")
    speed, accuracy, faults = json.loads(result.stdout.strip().splitlines()[-1])
    return float(speed), float(accuracy), float(faults)


def _epochs(text: str) -> int:
    """--epochs: a whole number from 1 to 100 (argparse prints this message, names the option and exits 2)."""
    if not text.isdigit() or not 1 <= int(text) <= 100:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of epochs from 1 to 100")
    return int(text)


def timed_epochs(epochs: int) -> str:
    """Which epochs the images/s column is over, in words."""
    return "of the one epoch" if epochs == 1 else f"over epochs 2-{epochs} (the first pays one-off costs)"


def add_test_samples_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--test-samples",
        type=int,
        default=TEST_IMAGES,
        help="test images for the accuracy column (default: all 10000; the train stage variant always uses all)",
    )


def minor_faults() -> int:
    """Minor page faults of this process so far: first touches of fresh pages (pipeline.common.allocator)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@dataclasses.dataclass(frozen=True)
class Run:
    images_per_second: float
    accuracy: float
    page_faults: float  # minor page faults per epoch while training (train stage: the whole process, per epoch)


def run_variants(
    variants: list[str], repeats: int, first_seed: int, run: Callable[[str, int], tuple[float, float, float]]
) -> dict[str, list[Run]]:
    """Each variant once per repeat in its own process, the order rotated per repeat; prints every run."""
    results: dict[str, list[Run]] = {name: [] for name in variants}
    for repeat in range(repeats):
        # A new seed per repeat: one epoch's accuracy moves by a few 0.01 % with the seed, so a single seed
        # cannot say which recipe is more accurate. Rotated, so no variant always runs first (or last).
        order = variants[repeat % len(variants) :] + variants[: repeat % len(variants)]
        for name in order:
            results[name].append(Run(*run(name, first_seed + repeat)))
        print(
            f"  repeat {repeat + 1} (seed {first_seed + repeat}): "
            + ", ".join(f"{name} {runs[-1].images_per_second:.0f} img/s" for name, runs in results.items()),
            flush=True,
        )
    return results


def ratios(results: dict[str, list[Run]], name: str, reference: str) -> list[float]:
    """`name` over `reference` within each repeat (the pair shared a window of the machine)."""
    return [a.images_per_second / b.images_per_second for a, b in zip(results[name], results[reference], strict=True)]


def table(results: dict[str, list[Run]], reference: str) -> str:
    lines = [
        f"| variant | images/s median (min-max) | vs {reference}: median (min-max) | test accuracy median (min-max) "
        "| page faults per epoch, millions (min-max) |",
        "| --- | ---: | ---: | ---: | ---: |",
    ]
    for name, runs in results.items():
        speeds = [run.images_per_second for run in runs]
        paired = ratios(results, name, reference)
        accuracies = [run.accuracy for run in runs]
        faults = [run.page_faults / 1e6 for run in runs]
        lines.append(
            f"| {name} | {statistics.median(speeds):.0f} ({min(speeds):.0f}-{max(speeds):.0f}) | "
            f"{statistics.median(paired):.2f}x ({min(paired):.2f}-{max(paired):.2f}x) | "
            f"{statistics.median(accuracies):.4f} ({min(accuracies):.4f}-{max(accuracies):.4f}) | "
            f"{statistics.median(faults):.2f} ({min(faults):.2f}-{max(faults):.2f}) |"
        )
    return "\n".join(lines)


def main(arguments: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--samples", type=int, default=60_000, help="training images per epoch (default: all)")
    parser.add_argument(
        "--repeats", type=int, default=3, help="fresh processes per variant; seeds train.seed + 0, 1, ..."
    )
    host = host_kind().name
    parser.add_argument("--device", choices=device_names(), default=host, help=f"where to train (default: {host})")
    parser.add_argument(
        "--epochs",
        type=_epochs,
        default=1,
        help="epochs per run (default 1); above 1, images/s is over the epochs after the first (use 3 on CUDA)",
    )
    add_test_samples_option(parser)
    parser.add_argument("--no-stage", action="store_true", help="leave out the `python -m stages.train` variant")
    parser.add_argument(
        "--variant",
        action="append",
        metavar="NAME",
        help="run only this variant (repeatable; the ratio column is against the first named; default: all)",
    )
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--seed", type=int, default=0, help=argparse.SUPPRESS)
    args = parser.parse_args(arguments)
    if args.worker:
        print(json.dumps(worker(args.worker, args.samples, args.seed, args.device, args.test_samples, args.epochs)))
        return
    config = load_params().train
    variants, headline = variants_for(config, args.device, not args.no_stage)
    if args.variant:
        variants = select_variants(variants, args.variant, parser)
    print(
        f"{args.samples} images x {args.epochs} epoch(s), images/s {timed_epochs(args.epochs)}; "
        f"{args.repeats} repeat(s) of {len(variants)} variants, each in a fresh process; "
        f"train.precision={config.precision}, train.threads={config.threads or 'one per core'}; device {args.device}",
        flush=True,
    )
    started = time.perf_counter()
    results = run_variants(
        [variant.name for variant in variants],
        args.repeats,
        config.seed,
        lambda name, seed: run_worker(
            name, args.samples, seed, args.device, test_samples=args.test_samples, epochs=args.epochs
        ),
    )
    print()
    print(table(results, variants[0].name if args.variant else "reference"))
    if {headline.name, "reference"} <= results.keys():
        paired = ratios(results, headline.name, "reference")
        spread = f"min-max {min(paired):.2f}-{max(paired):.2f}x over {len(paired)} paired repeats"
        print(f"\n{headline.name} vs reference: {statistics.median(paired):.2f}x ({spread}).")
    tracked = next((variant for variant in variants if variant.tracked), None)
    untracked = next((v for v in variants if tracked and same_loop(v, tracked) and not v.tracked), None)
    if tracked and untracked:
        kept = [100.0 * ratio for ratio in ratios(results, tracked.name, untracked.name)]

        def cost(share: float) -> float:  # in % of the untracked loop's time per image
            return 100.0 / share * 100.0 - 100.0

        print(
            f"tracking costs {cost(statistics.median(kept)):+.1f} % of the loop's time "
            f"(min-max {cost(max(kept)):+.1f} to {cost(min(kept)):+.1f} %): the tracked loop trains at "
            f"{statistics.median(kept):.1f} % of the untracked one's images/s "
            f"(min-max {min(kept):.1f}-{max(kept):.1f} %)."
        )
    print(f"{time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
