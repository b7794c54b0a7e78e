"""What MNIST is, as every wing needs it: image shape, classes and split sizes (defined here only)."""

from __future__ import annotations

IMAGE_HEIGHT = IMAGE_WIDTH = 28
IMAGE_SHAPE = (1, IMAGE_HEIGHT, IMAGE_WIDTH)  # channels, height, width of one sample, as the model takes it
CLASSES = 10
SPLIT_IMAGES = {"train": 60_000, "test": 10_000}

# The four official IDX files (decompressed names); a mirror holds each gzipped (`.gz`) or raw.
MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
MIRROR_ENV_VAR = "MNIST_MIRROR"  # a local folder the download stage tries first (offline use)
