"""Where stages write their outputs, relative to the project root; dvc.yaml declares the same paths."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

DATA_ROOT = Path("data")  # torchvision root: data/MNIST/raw/...
MODEL_CHECKPOINT = Path("models/model.pt")
TRAIN_METRICS = Path("metrics/train.json")  # deterministic: accuracy, loss
TRAIN_SPEED = Path("metrics/train_speed.json")  # wall-clock: differs run to run
TRAIN_STEPS_PLOT = Path("plots/train_steps.csv")
TRAIN_EPOCHS_PLOT = Path("plots/train_epochs.csv")
GRAPH_DIR = Path("graph")
GRAPH_PT2 = GRAPH_DIR / "model.pt2"  # torch.export archive, dynamic batch
GRAPH_PROGRAM = GRAPH_DIR / "model_pt2_graph.txt"  # the exported ATen graph as text
GRAPH_ONNX = GRAPH_DIR / "model.onnx"
GRAPH_DOT = GRAPH_DIR / "model_graph.dot"
GRAPH_SVG = GRAPH_DIR / "model_graph.svg"  # committed to git: shown in README
SUMMARY_MARKDOWN = GRAPH_DIR / "summary.md"
SUMMARY_CSV = GRAPH_DIR / "summary.csv"
SUMMARY_JSON = GRAPH_DIR / "summary.json"
GRAPH_METRICS = Path("metrics/graph.json")
HARDWARE_FINGERPRINT = Path("hardware/fingerprint.json")
HARDWARE_ROOFS = Path("hardware/roofs.json")  # matmul FLOP/s and triad bandwidth, measured once per machine
PROFILES_DIR = Path("profiles")  # profiles/<device>/: kept in git (tables, records)
TRACES_DIR = Path("traces")  # traces/<device>/: in DVC's cache (large)


@dataclass(frozen=True)
class ProfileOutputs:
    """Files of one profile combination: profiles/<device>/<batch>-<mode>/ and its trace in traces/<device>/."""

    folder: Path
    trace: Path  # Chrome/Perfetto trace (both open it gzipped)

    def files(self) -> tuple[Path, ...]:
        """Every file of the combination."""
        return (
            self.trace,
            self.table_markdown,
            self.table_csv,
            self.kernel_table_markdown,
            self.kernel_table_csv,
            self.memory_markdown,
            self.step_analysis,
            self.record,
            self.timing,
            self.metrics_file,
        )

    @property
    def table_markdown(self) -> Path:
        return self.folder / "top_operators.md"

    @property
    def table_csv(self) -> Path:
        return self.folder / "top_operators.csv"

    @property
    def kernel_table_markdown(self) -> Path:
        return self.folder / "top_kernels.md"  # GPU kernels (a one-line note on the CPU)

    @property
    def kernel_table_csv(self) -> Path:
        return self.folder / "top_kernels.csv"  # with each kernel's full name

    @property
    def memory_markdown(self) -> Path:
        return self.folder / "memory.md"  # what the step holds at its peak, by part; its energy or why none

    @property
    def step_analysis(self) -> Path:
        return self.folder / "step_analysis.json"  # numbers only: busy %, achieved FLOP/s (MLflow, the report)

    @property
    def record(self) -> Path:
        return self.folder / "profile.json"  # combination, hardware, settings, timing, top operators

    @property
    def timing(self) -> Path:
        return self.folder / "timing.json"  # numbers only: every timing figure (MLflow, the report)

    @property
    def metrics_file(self) -> Path:
        return self.folder / "metrics.json"  # DVC metrics: the headline, rounded, the same keys in every combination


def profile_outputs(batch_size: int, device: str, mode: str) -> ProfileOutputs:
    return ProfileOutputs(
        PROFILES_DIR / device / f"{batch_size}-{mode}", TRACES_DIR / device / f"{batch_size}-{mode}.json.gz"
    )


@dataclass(frozen=True)
class DeviceProfileOutputs:
    """What the `profile@<device>` stage writes beside its combinations' folders (as in dvc.yaml)."""

    device: str

    @property
    def folder(self) -> Path:
        return PROFILES_DIR / self.device

    @property
    def traces(self) -> Path:
        return TRACES_DIR / self.device

    @property
    def comparisons(self) -> Path:
        return self.folder / "comparisons.json"  # every paired ratio between the device's combinations

    @property
    def comparisons_markdown(self) -> Path:
        return self.folder / "comparisons.md"

    @property
    def metrics_file(self) -> Path:
        return Path("metrics") / f"profile_{self.device}.json"  # DVC metrics: the paired ratios, rounded


REPORT_DIR = Path("report")
REPORT_MARKDOWN = REPORT_DIR / "report.md"
REPORT_HTML = REPORT_DIR / "report.html"  # self-contained: figures embedded
REPORT_FIGURES = REPORT_DIR / "figures"
PROFILE_COMPARISON_PLOT = Path("plots/profile_comparison.csv")  # for `dvc plots show`

# Written by the `validate` stage, which every other stage depends on, so that DVC checks params.yaml
# before it deletes (and reruns) any other stage's outputs. Its content never changes.
PARAMS_CHECKED = Path("checks/params.ok")

# The folders each stage writes its outputs into (dvc.yaml's outs; tests keep the two in step).
# Before a stage starts, pipeline.common.stage_runner checks its own (writable, room left) and removes the temp
# folders that killed runs left in all of them (ALL_OUTPUT_FOLDERS).
STAGE_OUTPUT_FOLDERS: dict[str, tuple[Path, ...]] = {
    "validate": (PARAMS_CHECKED.parent, HARDWARE_FINGERPRINT.parent),
    "download": (DATA_ROOT,),
    "train": (MODEL_CHECKPOINT.parent, TRAIN_METRICS.parent, TRAIN_STEPS_PLOT.parent),
    "export_graph": (GRAPH_DIR, GRAPH_METRICS.parent),
    "roofs": (HARDWARE_ROOFS.parent,),
    "profile": (PROFILES_DIR, TRACES_DIR, TRAIN_METRICS.parent),
    "report": (REPORT_DIR, PROFILE_COMPARISON_PLOT.parent),
}
# Output folders whose outputs sit two levels down (profiles/<device>/<batch>-<mode>/).
NESTED_OUTPUT_FOLDERS = (PROFILES_DIR,)
# Each output folder once, data/ included (the download stage's), in the order above.
ALL_OUTPUT_FOLDERS: tuple[Path, ...] = tuple(
    dict.fromkeys(folder for folders in STAGE_OUTPUT_FOLDERS.values() for folder in folders)
)
