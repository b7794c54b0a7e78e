"""What MNIST is, as every wing needs it: image shape, classes and split sizes (defined here only)."""

from __future__ import annotations

IMAGE_HEIGHT = IMAGE_WIDTH = 28
IMAGE_SHAPE = (1, IMAGE_HEIGHT, IMAGE_WIDTH)  # channels, height, width of one sample, as the model takes it
CLASSES = 10
SPLIT_IMAGES = {"train": 60_000, "test": 10_000}
