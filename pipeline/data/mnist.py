"""Fetch, verify and store MNIST; load it back as tensors.

Layout written (what `torchvision.datasets.MNIST(root, download=False)` expects):

    <root>/MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte   decompressed IDX files
    <root>/MNIST/manifest.json                                        digests, sizes, sample counts

The manifest records only what the content determines (never which mirror served it), so every
clone that downloads MNIST gets byte-identical outputs and DVC sees the same hash.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import shutil
import tempfile
import urllib.error
import urllib.parse
import urllib.request
import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
from tqdm import tqdm

from pipeline.common.credentials import basic_auth_header, netrc_credentials, redact
from pipeline.common.dataset import MIRROR_ENV_VAR
from pipeline.common.errors import PipelineError
from pipeline.common.interrupts import enter_commit_point, pause_at
from pipeline.common.outputs import write_error_message
from pipeline.data.idx import IdxFormatError, parse_idx
from pipeline.params.schema import DataConfig

DATASET_DIR = "MNIST"
RAW_DIR = "raw"
MANIFEST_FILE = "manifest.json"

# SHA-256 of the decompressed official files (their well-known MD5s match as well).
MNIST_SHA256: Mapping[str, str] = {
    "train-images-idx3-ubyte": "ba891046e6505d7aadcbbe25680a0738ad16aec93bde7f9b65e87a2fc25776db",
    "train-labels-idx1-ubyte": "65a50cbbf4e906d70832878ad85ccda5333a97f0f4c3dd2ef09a8a9eef7101c5",
    "t10k-images-idx3-ubyte": "0fa7898d509279e482958e8ce81c8e77db3f2f8254e26661ceb7762c4d494ce7",
    "t10k-labels-idx1-ubyte": "ff7bcfd416de33731a308c3f266cc351222c34898ecbeaf847f06e48f7ec33f2",
}
# Decompressed sizes of the official files: nothing longer is read or inflated, so a decompression
# bomb or an endless response stops at these sizes instead of filling memory.
MNIST_BYTES: Mapping[str, int] = {
    "train-images-idx3-ubyte": 47_040_016,
    "train-labels-idx1-ubyte": 60_008,
    "t10k-images-idx3-ubyte": 7_840_016,
    "t10k-labels-idx1-ubyte": 10_008,
}
_DEFAULT_MAX_BYTES = 64 << 20  # a file name not in MNIST_BYTES
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
    limit = MNIST_BYTES.get(name, _DEFAULT_MAX_BYTES)
    for candidate in (f"{name}.gz", name):
        location = _join(mirror, candidate)
        try:
            # A gzip of incompressible data is a little larger than the data itself.
            payload = _read_location(location, candidate, config, limit + limit // 100 + 1024)
            content = _decompress(payload, limit)
            digest = hashlib.sha256(content).hexdigest()
            if digest != expected:
                raise _MirrorFailure(
                    f"corrupt or truncated: SHA-256 of the decompressed content is {digest}, expected {expected}"
                )
            parse_idx(content)
            return VerifiedFile(name=name, content=content, sha256=digest, source=redact(location))
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


def _read_location(location: str, label: str, config: DataConfig, limit: int) -> bytes:
    if location.startswith(("http://", "https://")):
        return _download(location, label, config, limit)
    path = (
        Path(urllib.request.url2pathname(location[len("file://") :]))
        if location.startswith("file://")
        else Path(location)
    )
    if not path.is_file():
        raise FileNotFoundError(path)
    with path.open("rb") as stream:
        return _read_with_progress(stream, path.stat().st_size, label, limit)


def _download(url: str, label: str, config: DataConfig, limit: int) -> bytes:
    request = urllib.request.Request(url, headers={"User-Agent": "mnist-lab-pipeline/1.0"})
    credentials = netrc_credentials(url)
    if credentials:
        # Unredirected: urllib would otherwise send it on to whatever host a redirect names.
        request.add_unredirected_header("Authorization", basic_auth_header(*credentials))
    error_text = ""
    for _ in range(config.retries + 1):
        try:
            with urllib.request.urlopen(request, timeout=config.timeout_s) as response:
                total = int(response.headers.get("Content-Length") or 0) or None
                payload = _read_with_progress(response, total, label, limit)
            if total is not None and len(payload) != total:
                raise _MirrorFailure(f"truncated download: {len(payload)} of {total} bytes")
            return payload
        except urllib.error.HTTPError as error:
            if error.code in (403, 404, 410):
                raise FileNotFoundError(url) from None  # this mirror lacks the file: try the next name
            error_text = f"HTTP {error.code} {error.reason}"
            if error.code == 401:
                host = urllib.parse.urlsplit(url).hostname
                hint = "wrong credentials in" if credentials else "no credentials for it in"
                error_text += f" ({hint} ~/.netrc: add `machine {host} login <user> password <password>`)"
        except OSError as error:  # URLError, timeouts and refused connections are all OSErrors
            error_text = f"unreachable ({getattr(error, 'reason', error)})"
    raise _MirrorFailure(error_text, unreachable=True)


def _read_with_progress(stream: BinaryIO, total: int | None, label: str, limit: int) -> bytes:
    """Everything `stream` holds, refusing more than `limit` bytes (checked before reading, when announced)."""
    if total is not None and total > limit:
        raise _MirrorFailure(_too_large(total, limit))
    buffer = io.BytesIO()
    with tqdm(total=total, unit="B", unit_scale=True, unit_divisor=1024, desc=label, leave=False) as bar:
        while chunk := stream.read(_CHUNK):
            buffer.write(chunk)
            bar.update(len(chunk))
            if buffer.tell() > limit:
                raise _MirrorFailure(_too_large(buffer.tell(), limit))
    return buffer.getvalue()


def _too_large(size: int, limit: int) -> str:
    return f"corrupt: more than {limit:,} bytes ({size:,}+), larger than the real file can be"


def _decompress(payload: bytes, limit: int) -> bytes:
    """Inflate a gzip payload (raw IDX passes through), stopping past `limit` output bytes.

    `gzip.decompress` would inflate all of it first: 12 GiB of zeros compress to 12 MB.
    """
    if payload[:2] != b"\x1f\x8b":  # not gzip: a raw IDX file
        return payload
    output = bytearray()
    pending = payload
    try:
        while pending:
            member = zlib.decompressobj(wbits=31)  # one gzip member; a file may hold several
            while True:
                output += member.decompress(pending, limit + 1 - len(output))
                if len(output) > limit:
                    raise _MirrorFailure(
                        f"corrupt: decompresses to more than {limit:,} bytes, the size of the real file "
                        "(a damaged file or a decompression bomb)"
                    )
                pending = member.unconsumed_tail
                if member.eof:
                    pending = member.unused_data
                    break
                if not pending:
                    raise _MirrorFailure("corrupt or truncated gzip (the compressed stream ends early)")
    except zlib.error as error:
        raise _MirrorFailure(f"corrupt or truncated gzip ({error})") from None
    return bytes(output)


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
    """Write the verified files under `root/MNIST` atomically: complete or not at all.

    The temp folders carry this process's pid, so a later run can remove what a killed one left
    (pipeline.common.outputs.sweep_stale_partials).
    """
    try:
        return _write_dataset(result, root)
    except OSError as error:
        need = sum(len(f.content) for f in result.files)
        raise PipelineError(
            f"{write_error_message(error)} The data set needs {need / 2**20:.0f} MiB in {root}/. "
            f"Nothing was written; {root / DATASET_DIR} is as it was."
        ) from None


def _write_dataset(result: DownloadResult, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    final = root / DATASET_DIR
    staging = Path(tempfile.mkdtemp(prefix=f".{DATASET_DIR}.partial-{os.getpid()}-", dir=root))
    try:
        raw = staging / RAW_DIR
        raw.mkdir()
        for verified in result.files:
            (raw / verified.name).write_bytes(verified.content)
        (staging / MANIFEST_FILE).write_text(json.dumps(build_manifest(result), indent=2, sort_keys=True) + "\n")
        staging.chmod(0o755)  # mkdtemp makes it private; the data set is not a secret
        pause_at("commit")
        enter_commit_point()  # pipeline.common.interrupts: no signal cuts the swap below in half
        if final.exists():
            retired = Path(tempfile.mkdtemp(prefix=f".{DATASET_DIR}.old-{os.getpid()}-", dir=root))
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


_RESTORE_DATA = "Run `dvc checkout data/MNIST` to restore it from the DVC cache, or `dvc repro -f download`."


def read_manifest(root: Path) -> dict[str, object]:
    """The manifest of a data set written by `write_dataset`; clear error if the download stage never ran
    or the file was damaged (its structure is checked: `dataset_digest`, and a SHA-256 per file)."""
    path = root / DATASET_DIR / MANIFEST_FILE
    try:
        manifest = json.loads(path.read_bytes())
    except FileNotFoundError:
        raise PipelineError(f"{path} is missing: run the download stage first (`dvc repro download`).") from None
    except (OSError, ValueError) as error:  # unreadable, not UTF-8, not JSON
        raise PipelineError(f"{path} is not a readable JSON manifest ({error}). {_RESTORE_DATA}") from None
    problem = _manifest_problem(manifest)
    if problem:
        raise PipelineError(f"{path} is not a manifest written by the download stage: {problem}. {_RESTORE_DATA}")
    return manifest  # type: ignore[no-any-return]


def _manifest_problem(manifest: object) -> str | None:
    if not isinstance(manifest, dict):
        return "it is not a JSON object"
    if not isinstance(manifest.get("dataset_digest"), str):
        return "`dataset_digest` is missing"
    files = manifest.get("files")
    if not isinstance(files, dict):
        return "`files` is missing"
    for name in MNIST_SHA256:
        entry = files.get(name)
        if not isinstance(entry, dict) or not isinstance(entry.get("sha256"), str):
            return f"`files` has no SHA-256 for {name}"
    return None


def load_split(root: Path, split: Split) -> tuple[np.ndarray, np.ndarray]:
    """Images (N, 28, 28) uint8 and labels (N,) uint8 of one split, verified against the manifest."""
    manifest = read_manifest(root)
    prefix = SPLIT_PREFIX[split]
    arrays = []
    for kind in ("images-idx3", "labels-idx1"):
        name = f"{prefix}-{kind}-ubyte"
        path = root / DATASET_DIR / RAW_DIR / name
        try:
            content = path.read_bytes()
        except OSError as error:  # deleted, replaced by a folder, unreadable
            raise PipelineError(
                f"{path} cannot be read ({error.strerror}); the data folder was modified. {_RESTORE_DATA}"
            ) from None
        expected = manifest["files"][name]["sha256"]  # type: ignore[index]
        if hashlib.sha256(content).hexdigest() != expected:
            raise PipelineError(
                f"{path} does not match the SHA-256 in its manifest ({expected}); the data folder was modified. "
                "Run `dvc checkout` or `dvc repro -f download` to restore it."
            )
        arrays.append(parse_idx(content))
    return arrays[0], arrays[1]
