"""Data for the tests: the lab's model config and tiny IDX files shaped like MNIST's."""

from __future__ import annotations

import gzip
import hashlib
import struct
from pathlib import Path

import numpy as np

from pipeline.data.idx import UNSIGNED_BYTE
from pipeline.params.schema import ModelConfig

LAB_MODEL = ModelConfig(conv1_channels=32, conv2_channels=64, hidden_units=128, conv_dropout=0.25, hidden_dropout=0.5)


def make_synthetic_mnist(folder: Path, train: int = 40, test: int = 20, gz: bool = True) -> dict[str, str]:
    """Write four tiny IDX files shaped like MNIST's; return their SHA-256 digests (decompressed)."""
    folder.mkdir(parents=True, exist_ok=True)
    generator = np.random.default_rng(0)
    digests = {}
    for prefix, count in (("train", train), ("t10k", test)):
        labels = (np.arange(count) % 10).astype(np.uint8)
        images = generator.integers(0, 256, size=(count, 28, 28), dtype=np.uint8)
        for name, array in ((f"{prefix}-images-idx3-ubyte", images), (f"{prefix}-labels-idx1-ubyte", labels)):
            content = encode_idx(array)
            digests[name] = hashlib.sha256(content).hexdigest()
            target = folder / (name + ".gz" if gz else name)
            target.write_bytes(gzip.compress(content, mtime=0) if gz else content)
    return digests


def encode_idx(array: np.ndarray) -> bytes:
    """Encode a uint8 array as IDX (the pipeline only reads IDX; the tests write small files)."""
    if array.dtype != np.uint8:
        raise ValueError(f"IDX encoding here supports uint8 only, got {array.dtype}")
    header = struct.pack(">HBB", 0, UNSIGNED_BYTE, array.ndim) + struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.tobytes()
