"""Where stages write their outputs, relative to the project root; dvc.yaml declares the same paths."""

from pathlib import Path

DATA_ROOT = Path("data")  # torchvision root: data/MNIST/raw/...
