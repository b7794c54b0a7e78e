"""Where stages write their outputs, relative to the project root; dvc.yaml declares the same paths."""

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
