"""Download stage library: mirrors (local .gz, local raw, HTTP), verification, atomic writes, loading."""

from __future__ import annotations

import functools
import gzip
import hashlib
import http.server
import shutil
import threading
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from pipeline.common.errors import PipelineError
from pipeline.data.artifacts import sample_grid
from pipeline.data.idx import IdxFormatError, parse_idx
from pipeline.data.mnist import MNIST_SHA256, fetch_mnist, load_split, mirror_candidates, read_manifest, write_dataset
from pipeline.params.parsing import params_from_mapping
from pipeline.params.schema import DataConfig
from tests.helpers.data import encode_idx, make_synthetic_mnist
from tests.helpers.servers import closed_port

TRAIN_IMAGES = "train-images-idx3-ubyte"


@pytest.fixture
def data_config(repo_params: dict[str, Any]) -> DataConfig:
    return replace(params_from_mapping(repo_params).data, retries=0, timeout_s=5)


def _no_leftovers(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_real_mnist_from_gz_mirror_is_verified_and_loads_in_torchvision(
    mnist_mirror: Path, data_config: DataConfig, tmp_path: Path
) -> None:
    result = fetch_mnist(data_config, [str(mnist_mirror)])
    assert {f.name: f.sha256 for f in result.files} == dict(MNIST_SHA256)
    assert result.file(TRAIN_IMAGES).sample_count == 60_000
    written = write_dataset(result, tmp_path / "data")
    manifest = read_manifest(tmp_path / "data")
    assert manifest["dataset_digest"] == result.dataset_digest
    assert manifest["files"]["t10k-labels-idx1-ubyte"]["samples"] == 10_000  # type: ignore[index]
    assert "source" not in str(manifest)  # content only: every clone gets identical bytes

    import torchvision  # here, not at the top: 2 s of import (its models) that collection would pay

    train = torchvision.datasets.MNIST(str(tmp_path / "data"), train=True, download=False)
    test = torchvision.datasets.MNIST(str(tmp_path / "data"), train=False, download=False)
    assert (len(train), len(test)) == (60_000, 10_000)
    assert train[0][1] == 5 and test[0][1] == 7  # the well-known first labels of each split
    images, labels = load_split(tmp_path / "data", "train")
    assert np.array_equal(images[0], np.asarray(train[0][0]))
    assert np.bincount(labels).tolist()[:2] == [5923, 6742]
    assert written == tmp_path / "data" / "MNIST"
    assert _no_leftovers(tmp_path / "data") == ["MNIST"]


def test_raw_files_mirror_gives_identical_result(mnist_mirror: Path, data_config: DataConfig, tmp_path: Path) -> None:
    raw_mirror = tmp_path / "raw-mirror"
    raw_mirror.mkdir()
    for name in MNIST_SHA256:
        (raw_mirror / name).write_bytes(gzip.decompress((mnist_mirror / f"{name}.gz").read_bytes()))
    from_raw = fetch_mnist(data_config, [str(raw_mirror)])
    from_gz = fetch_mnist(data_config, [mnist_mirror.as_uri()])  # file:// URL form
    assert from_raw.dataset_digest == from_gz.dataset_digest
    assert from_raw.file(TRAIN_IMAGES).source.endswith(TRAIN_IMAGES)
    assert from_gz.file(TRAIN_IMAGES).source.endswith(".gz")


def test_corrupt_file_names_file_and_both_digests_and_writes_nothing(
    mnist_mirror: Path, data_config: DataConfig, tmp_path: Path
) -> None:
    corrupt = tmp_path / "corrupt-mirror"
    shutil.copytree(mnist_mirror, corrupt)
    content = bytearray(gzip.decompress((corrupt / f"{TRAIN_IMAGES}.gz").read_bytes()))
    content[1000] ^= 0xFF  # one flipped pixel: a valid gzip with the wrong content
    (corrupt / f"{TRAIN_IMAGES}.gz").write_bytes(gzip.compress(bytes(content), compresslevel=1))
    with pytest.raises(PipelineError) as caught:
        fetch_mnist(data_config, [str(corrupt)])
    message = str(caught.value)
    assert TRAIN_IMAGES in message
    assert f"expected {MNIST_SHA256[TRAIN_IMAGES]}" in message
    assert f"content is {hashlib.sha256(bytes(content)).hexdigest()}" in message
    assert "Nothing was written" in message and "MNIST_MIRROR" in message
    assert not (tmp_path / "data").exists()


def test_truncated_gzip_is_reported_as_corrupt(mnist_mirror: Path, data_config: DataConfig, tmp_path: Path) -> None:
    truncated = tmp_path / "truncated-mirror"
    shutil.copytree(mnist_mirror, truncated)
    gz = truncated / "t10k-labels-idx1-ubyte.gz"
    gz.write_bytes(gz.read_bytes()[:1000])
    with pytest.raises(PipelineError, match=r"t10k-labels-idx1-ubyte\.gz: corrupt or truncated gzip"):
        fetch_mnist(data_config, [str(truncated)])


def test_corrupt_first_mirror_falls_back_to_next(mnist_mirror: Path, data_config: DataConfig, tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / f"{TRAIN_IMAGES}.gz").write_bytes(b"not a gzip at all")
    result = fetch_mnist(data_config, [str(broken), str(mnist_mirror)])
    assert result.file(TRAIN_IMAGES).source == str(mnist_mirror / f"{TRAIN_IMAGES}.gz")


def test_unreachable_mirrors_list_every_attempt_and_the_offline_fix(data_config: DataConfig) -> None:
    dead = [f"http://127.0.0.1:{closed_port()}/mnist/", f"http://127.0.0.1:{closed_port()}/other/"]
    with pytest.raises(PipelineError) as caught:
        fetch_mnist(data_config, dead)
    message = str(caught.value)
    for mirror in dead:
        assert f"{mirror}{TRAIN_IMAGES}.gz: unreachable" in message
    assert "set MNIST_MIRROR to a local folder" in message
    assert "corrupt copy" not in message  # only network problems here: no misleading advice


@pytest.fixture
def http_mirror(mnist_mirror: Path) -> Iterator[str]:
    """The offline mirror served over real HTTP on 127.0.0.1."""
    handler = functools.partial(_QuietHandler, directory=str(mnist_mirror))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/"
    server.shutdown()
    server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:  # keep test output clean
        pass


def test_http_mirror_downloads_and_verifies(http_mirror: str, data_config: DataConfig, tmp_path: Path) -> None:
    result = fetch_mnist(data_config, [f"http://127.0.0.1:{closed_port()}/", http_mirror])
    assert {f.name: f.sha256 for f in result.files} == dict(MNIST_SHA256)
    assert result.file(TRAIN_IMAGES).source == f"{http_mirror}{TRAIN_IMAGES}.gz"


def test_mnist_mirror_env_var_comes_first_and_must_exist(data_config: DataConfig, tmp_path: Path) -> None:
    assert mirror_candidates(data_config, {"MNIST_MIRROR": str(tmp_path)}) == [str(tmp_path), *data_config.mirrors]
    assert mirror_candidates(data_config, {}) == list(data_config.mirrors)
    with pytest.raises(PipelineError, match="MNIST_MIRROR='/no/such/folder' is not a folder"):
        mirror_candidates(data_config, {"MNIST_MIRROR": "/no/such/folder"})


def test_synthetic_dataset_roundtrip_replaces_previous_output_atomically(
    data_config: DataConfig, tmp_path: Path
) -> None:
    mirror = tmp_path / "synthetic"
    digests = make_synthetic_mnist(mirror, train=30, test=10)
    root = tmp_path / "data"
    (root / "MNIST").mkdir(parents=True)
    (root / "MNIST" / "stale.txt").write_text("from an older run")
    write_dataset(fetch_mnist(data_config, [str(mirror)], expected_sha256=digests), root)
    assert _no_leftovers(root) == ["MNIST"]
    assert not (root / "MNIST" / "stale.txt").exists()
    images, labels = load_split(root, "test")
    assert images.shape == (10, 28, 28) and labels.tolist() == list(range(10))


def test_tampered_data_is_detected_on_load(data_config: DataConfig, tmp_path: Path) -> None:
    digests = make_synthetic_mnist(tmp_path / "synthetic")
    root = tmp_path / "data"
    write_dataset(fetch_mnist(data_config, [str(tmp_path / "synthetic")], expected_sha256=digests), root)
    labels_file = root / "MNIST" / "raw" / "train-labels-idx1-ubyte"
    labels_file.write_bytes(labels_file.read_bytes()[:-1] + b"\x03")  # the last label was 9
    with pytest.raises(PipelineError, match="does not match the SHA-256 in its manifest"):
        load_split(root, "train")
    with pytest.raises(PipelineError, match="run the download stage first"):
        load_split(tmp_path / "elsewhere", "train")


def test_idx_parser_rejects_malformed_files() -> None:
    array = np.arange(24, dtype=np.uint8).reshape(2, 3, 4)
    assert np.array_equal(parse_idx(encode_idx(array)), array)
    with pytest.raises(IdxFormatError, match="magic bytes"):
        parse_idx(b"\x1f\x8b\x08\x00rest")
    with pytest.raises(IdxFormatError, match="promises shape"):
        parse_idx(encode_idx(array)[:-1])


def test_sample_grid_has_one_row_per_class() -> None:
    labels = np.repeat(np.arange(10, dtype=np.uint8), 3)
    images = np.repeat(labels[:, None, None], 28 * 28, axis=1).reshape(30, 28, 28) * 20 + 5
    grid = sample_grid(images, labels, per_class=3)
    assert grid.shape == (10 * 30 + 2, 3 * 30 + 2, 1)
    for digit in range(10):  # every cell of row `digit` shows an image of that digit
        row = grid[2 + digit * 30 : 2 + digit * 30 + 28, 2:-2, 0]
        assert set(np.unique(row)) == {0, digit * 20 + 5}
