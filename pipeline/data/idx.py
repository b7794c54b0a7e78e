"""The IDX file format of MNIST: a big-endian header (magic, dimension sizes) followed by raw bytes.

http://yann.lecun.com/exdb/mnist/ — magic 0x00000801 for label files (1 dimension) and 0x00000803
for image files (3 dimensions), element type unsigned byte (0x08).
"""

from __future__ import annotations

import struct

import numpy as np

UNSIGNED_BYTE = 0x08


class IdxFormatError(ValueError):
    """The bytes are not a well-formed unsigned-byte IDX file."""


def parse_idx(payload: bytes) -> np.ndarray:
    """Return the array stored in an unsigned-byte IDX payload (read-only view, no copy)."""
    if len(payload) < 4:
        raise IdxFormatError(f"only {len(payload)} bytes, shorter than the 4-byte IDX magic number")
    zero, element_type, dimensions = struct.unpack(">HBB", payload[:4])
    if zero != 0 or element_type != UNSIGNED_BYTE or dimensions == 0:
        raise IdxFormatError(f"magic bytes {payload[:4].hex()} are not those of an unsigned-byte IDX file")
    header_size = 4 + 4 * dimensions
    if len(payload) < header_size:
        raise IdxFormatError(f"header needs {header_size} bytes, file has {len(payload)}")
    shape = struct.unpack(f">{dimensions}I", payload[4:header_size])
    expected = header_size + int(np.prod(shape, dtype=np.int64))
    if len(payload) != expected:
        raise IdxFormatError(f"header promises shape {shape} ({expected} bytes) but the file has {len(payload)} bytes")
    return np.frombuffer(payload, dtype=np.uint8, offset=header_size).reshape(shape)
