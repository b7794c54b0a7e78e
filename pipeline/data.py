"""Fetch, verify and store MNIST; load it back as tensors.

Layout written (what `torchvision.datasets.MNIST(root, download=False)` expects):

    <root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte   decompressed IDX files
    <root>/MNIST/manifest.json                                        digests, sizes, sample counts

The manifest records only what the content determines (never which mirror served it), so every
clone that downloads MNIST gets byte-identical outputs and DVC sees the same hash.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.request
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
from tqdm import tqdm

from pipeline.config import DataConfig
from pipeline.errors import PipelineError
from pipeline.idx import IdxFormatError, parse_idx

DATASET_DIR = "MNIST"
RAW_DIR = "raw"
MANIFEST_FILE = "manifest.json"
MIRROR_ENV_VAR = "MNIST_MIRROR"

# SHA-256 of the decompressed official files (their well-known MD5s match as well).
MNIST_SHA256: Mapping[str, str] = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
SPLIT_PREFIX: Mapping[str, str] = {"train": "train", "test": "t10k"}
Split = Literal["train", "test"]

_CHUNK = 1 << 16
_OFFLINE_HINT = (
    f"To work offline, set {MIRROR_ENV_VAR} to a local folder holding the four MNIST IDX files "
    f"(.gz or raw), e.g. `{MIRROR_ENV_VAR}=../shared/mnist make repro`."
)


@dataclass(frozen=True)
class VerifiedFile:
    name: str
    content: bytes  # decompressed IDX bytes, digest already checked
    sha256: str
    source: str  # where it came from: logged to MLflow, kept out of the manifest

    @property
    def sample_count(self) -> int:
        return int(parse_idx(self.content).shape[0])


@dataclass(frozen=True)
class DownloadResult:
    files: tuple[VerifiedFile, ...]
    dataset_digest: str

    def file(self, name: str) -> VerifiedFile:
        return next(f for f in self.files if f.name == name)

    def split(self, split: Split) -> tuple[np.ndarray, np.ndarray]:
        prefix = SPLIT_PREFIX[split]
        images = parse_idx(self.file(f"{prefix}-images-idx3-ubyte").content)
        labels = parse_idx(self.file(f"{prefix}-labels-idx1-ubyte").content)
        return images, labels


class _MirrorFailure(Exception):
    """One attempt failed; `unreachable` means the whole mirror is down, not just this file."""

    def __init__(self, reason: str, unreachable: bool = False):
        super().__init__(reason)
        self.unreachable = unreachable


def dataset_digest(file_digests: Mapping[str, str]) -> str:
    """One SHA-256 naming the whole data set: independent of mirror, compression and file order."""
    lines = "".join(f"{digest}  {name}\n" for name, digest in sorted(file_digests.items()))
    return hashlib.sha256(lines.encode()).hexdigest()


def mirror_candidates(config: DataConfig, environ: Mapping[str, str] = os.environ) -> list[str]:
    """$MNIST_MIRROR first (offline use), then the mirrors from params, in order."""
    local = environ.get(MIRROR_ENV_VAR, "").strip()
    if local and not Path(local).expanduser().is_dir():
        raise PipelineError(
            f"{MIRROR_ENV_VAR}={local!r} is not a folder. Point it at a folder holding the four MNIST "
            f"IDX files (.gz or raw), or unset it to use the mirrors in params.yaml `data.mirrors`."
        )
    return ([str(Path(local).expanduser())] if local else []) + list(config.mirrors)


def fetch_mnist(
    config: DataConfig,
    mirrors: list[str],
    expected_sha256: Mapping[str, str] = MNIST_SHA256,
) -> DownloadResult:
    """Fetch and verify every file in memory; raise PipelineError naming each attempt on failure."""
    down: dict[str, str] = {}  # mirrors that failed at the connection level: skipped for later files
    verified = []
    for name, expected in expected_sha256.items():
        attempts: list[str] = []
        for mirror in mirrors:
            if mirror in down:
                attempts.append(f"{mirror}: skipped, unreachable earlier ({down[mirror]})")
                continue
            try:
                verified.append(_fetch_from_mirror(mirror, name, expected, config, attempts))
                break
            except _MirrorFailure as failure:
                if failure.unreachable:
                    down[mirror] = str(failure)
        else:
            raise PipelineError(_no_copy_message(name, attempts))
    digests = {f.name: f.sha256 for f in verified}
    return DownloadResult(files=tuple(verified), dataset_digest=dataset_digest(digests))


def _fetch_from_mirror(mirror: str, name: str, expected: str, config: DataConfig, attempts: list[str]) -> VerifiedFile:
    """Try `<name>.gz` then `<name>` on one mirror; record every failed attempt in `attempts`."""
    last_failure = _MirrorFailure("no attempt made")
    for candidate in (f"{name}.gz", name):
        location = _join(mirror, candidate)
        try:
            payload = _read_location(location, candidate, config)
            content = _decompress(payload, location)
            digest = hashlib.sha256(content).hexdigest()
            if digest != expected:
                raise _MirrorFailure(
                    f"corrupt or truncated: SHA-256 of the decompressed content is {digest}, expected {expected}"
                )
            parse_idx(content)
            return VerifiedFile(name=name, content=content, sha256=digest, source=location)
        except FileNotFoundError:
            attempts.append(f"{location}: not found")
            last_failure = _MirrorFailure("not found")
        except IdxFormatError as error:
            attempts.append(f"{location}: not an IDX file ({error})")
            last_failure = _MirrorFailure(str(error))
        except _MirrorFailure as failure:
            attempts.append(f"{location}: {failure}")
            if failure.unreachable:
                raise
            last_failure = failure
    raise last_failure


def _join(mirror: str, filename: str) -> str:
    if "://" in mirror:
        return mirror.rstrip("/") + "/" + filename
    return str(Path(mirror) / filename)


def _read_location(location: str, label: str, config: DataConfig) -> bytes:
    if location.startswith(("http://", "https://")):
        return _download(location, label, config)
    path = Path(urllib.request.url2pathname(location[len("file://") :])) if location.startswith("file://") else Path(location)
    if not path.is_file():
        raise FileNotFoundError(path)
    with path.open("rb") as stream:
        return _read_with_progress(stream, path.stat().st_size, label)


def _download(url: str, label: str, config: DataConfig) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "mnist-lab-pipeline/1.0"})
    error_text = ""
    for _ in range(config.retries + 1):
        try:
            with urllib.request.urlopen(request, timeout=config.timeout_s) as response:
                total = int(response.headers.get("Content-Length") or 0) or None
                payload = _read_with_progress(response, total, label)
            if total is not None and len(payload) != total:
                raise _MirrorFailure(f"truncated download: {len(payload)} of {total} bytes")
            return payload
        except urllib.error.HTTPError as error:
            if error.code in (403, 404, 410):
                raise FileNotFoundError(url) from None  # this mirror lacks the file: try the next name
            error_text = f"HTTP {error.code} {error.reason}"
        except OSError as error:  # URLError, timeouts and refused connections are all OSErrors
            error_text = f"unreachable ({getattr(error, 'reason', error)})"
    raise _MirrorFailure(error_text, unreachable=True)


def _read_with_progress(stream: BinaryIO, total: int | None, label: str) -> bytes:
    buffer = io.BytesIO()
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, leave=False) as bar:
        while chunk := stream.read(_CHUNK):
            buffer.write(chunk)
            bar.update(len(chunk))
    return buffer.getvalue()


def _decompress(payload: bytes, location: str) -> bytes:
    if payload[:2] != b"\x1f\x8b":  # not gzip: a raw IDX file
        return payload
    try:
        return gzip.decompress(payload)
    except (EOFError, gzip.BadGzipFile, zlib.error) as error:
        raise _MirrorFailure(f"corrupt or truncated gzip ({error})") from None


def _no_copy_message(name: str, attempts: list[str]) -> str:
    tried = "\n".join(f"  - {attempt}" for attempt in attempts)
    corrupt_hint = (
        "A corrupt copy must be replaced at its mirror (or removed there so the next mirror serves it). "
        if any("corrupt or truncated" in attempt for attempt in attempts)
        else ""
    )
    return (
        f"could not get a verified copy of MNIST file {name}. Tried, in order:\n{tried}\n"
        f"Nothing was written. {corrupt_hint}The mirror list is params.yaml `data.mirrors`. {_OFFLINE_HINT}"
    )


def write_dataset(result: DownloadResult, root: Path) -> Path:
    """Write the verified files under `root/MNIST` atomically: complete or not at all."""
    root.mkdir(parents=True, exist_ok=True)
    final = root / DATASET_DIR
    staging = Path(tempfile.mkdtemp(prefix=f".{DATASET_DIR}.partial-", dir=root))
    try:
        raw = staging / RAW_DIR
        raw.mkdir()
        for verified in result.files:
            (raw / verified.name).write_bytes(verified.content)
        (staging / MANIFEST_FILE).write_text(json.dumps(build_manifest(result), indent=2, sort_keys=True) + "\n")
        staging.chmod(0o755)  # mkdtemp makes it private; the data set is not a secret
        if final.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{DATASET_DIR}.old-", dir=root))
            os.replace(final, retired / DATASET_DIR)
            os.replace(staging, final)
            shutil.rmtree(retired)
        else:
            os.replace(staging, final)
    finally:
        if staging.exists():
            shutil.rmtree(staging)
    return final


def build_manifest(result: DownloadResult) -> dict[str, object]:
    return {
        "dataset": "MNIST",
        "dataset_digest": result.dataset_digest,
        "files": {
            f.name: {"sha256": f.sha256, "bytes": len(f.content), "samples": f.sample_count} for f in result.files
        },
    }


def read_manifest(root: Path) -> dict[str, object]:
    """The manifest of a data set written by `write_dataset`; clear error if the download stage never ran."""
    path = root / DATASET_DIR / MANIFEST_FILE
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise PipelineError(f"{path} is missing: run the download stage first (`dvc repro download`).") from None


def load_split(root: Path, split: Split) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and labels (N,) uint8 of one split, verified against the manifest."""
    manifest = read_manifest(root)
    prefix = SPLIT_PREFIX[split]
    arrays = []
    for kind in ("images-idx3", "labels-idx1"):
        name = f"{prefix}-{kind}-ubyte"
        path = root / DATASET_DIR / RAW_DIR / name
        content = path.read_bytes()
        expected = manifest["files"][name]["sha256"]  # type: ignore[index]
        if hashlib.sha256(content).hexdigest() != expected:
            raise PipelineError(
                f"{path} does not match the SHA-256 in its manifest ({expected}); the data folder was modified. "
                "Run `dvc checkout` or `dvc repro -f download` to restore it."
            )
        arrays.append(parse_idx(content))
    return arrays[0], arrays[1]
