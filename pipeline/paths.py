"""Where stages write their outputs, relative to the project root; dvc.yaml declares the same paths."""

from pathlib import Path

DATA_ROOT = Path("data")  # torchvision root: data/MNIST/raw/...
MODEL_CHECKPOINT = Path("models/model.pt")
TRAIN_METRICS = Path("metrics/train.json")  # deterministic: accuracy, loss
TRAIN_SPEED = Path("metrics/train_speed.json")  # wall-clock: differs run to run
TRAIN_STEPS_PLOT = Path("plots/train_steps.csv")
TRAIN_EPOCHS_PLOT = Path("plots/train_epochs.csv")
