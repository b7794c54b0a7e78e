"""Self-describing checkpoints: weights plus everything needed to rebuild and trust them.

Only tensors, dicts, lists, strings and numbers go in, so `torch.load(weights_only=True)` (no
arbitrary unpickling) reads them, and a later stage rebuilds the model from the file alone.

Each checkpoint carries a SHA-256 of its own payload (`payload_sha256`), checked by every loader: a bit flipped
inside the weights still unpickles, and without the digest a stage run directly (not through `dvc repro`, whose
`dvc status` would notice) would export or profile damaged weights as if they were the trained ones.
"""

from __future__ import annotations

import hashlib
import json
import math
import pickle
import shutil
import warnings
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipeline.common.dataset import IMAGE_SHAPE
from pipeline.common.errors import PipelineError
from pipeline.devices.registry import host_kind
from pipeline.model.network import LabNet
from pipeline.params.memory import check_model_fits_memory
from pipeline.params.parsing import params_from_section
from pipeline.params.schema import ModelConfig

# 2: with `payload_sha256`. Format 1 (no digest) is refused: it cannot be verified, and a retrain writes format 2.
CHECKPOINT_FORMAT = 2
DIGEST_KEY = "payload_sha256"


def checkpoint_payload(
    model: LabNet, train_params: dict[str, Any], data_digest: str, runtime: dict[str, Any], metrics: dict[str, float]
) -> dict[str, Any]:
    # Weights always saved from CPU and in the default layout, so the bytes do not depend on
    # the training device or memory format.
    state = {name: tensor.detach().cpu().contiguous() for name, tensor in model.state_dict().items()}
    _refuse_diverged(state, metrics)
    return {
        "format": CHECKPOINT_FORMAT,
        "state_dict": state,
        "model": model.checkpoint_description(),
        "train_params": train_params,
        "data_digest": data_digest,
        "runtime": runtime,
        "metrics": metrics,
        "torch_version": str(torch.__version__),  # TorchVersion would need an unpickling allow-list
    }


def _refuse_diverged(
    state: Mapping[str, torch.Tensor], metrics: Mapping[str, float], consequence: str = "so no checkpoint was written"
) -> None:
    """A NaN/inf model is no result: say so instead of saving it (or passing it downstream)."""
    bad_metrics = sorted(key for key, value in metrics.items() if not math.isfinite(value))
    bad_weights = sorted(
        name for name, tensor in state.items() if tensor.is_floating_point() and not bool(torch.isfinite(tensor).all())
    )
    if bad_metrics or bad_weights:
        raise PipelineError(
            f"training diverged: {', '.join(bad_metrics + bad_weights)} hold NaN or infinity, {consequence}. "
            "Lower `train.lr` (or use `train.precision: fp32`) in params.yaml and retrain (`dvc repro train`)."
        )


def payload_digest(payload: Mapping[str, Any]) -> str:
    """SHA-256 of a checkpoint's content, independent of how torch laid it out in the file.

    The zip container (record order, padding, pickle protocol) may differ between torch versions for the same
    content, so the file's bytes are no stable reference; hashed instead: every tensor of the state_dict by
    name — its name, dtype, shape and raw bytes (native order: little-endian on every machine torch runs on) —
    then every other field as canonical JSON (sorted keys, no spaces; floats as their shortest round-trip
    text). A few MB of weights: milliseconds. Raises TypeError or ValueError on content JSON cannot write.
    """
    hasher = hashlib.sha256()
    state: Mapping[str, torch.Tensor] = payload["state_dict"]
    for name in sorted(state):
        tensor = state[name].detach().cpu().contiguous()
        header = json.dumps([name, str(tensor.dtype), list(tensor.shape)], separators=(",", ":"))
        hasher.update(header.encode() + b"\n")
        hasher.update(tensor.reshape(-1).view(torch.uint8).numpy().tobytes())  # reshape: 0-d tensors too
    fields = {key: value for key, value in payload.items() if key not in ("state_dict", DIGEST_KEY)}
    hasher.update(json.dumps(fields, sort_keys=True, separators=(",", ":")).encode())
    return hasher.hexdigest()


def save_checkpoint(payload: dict[str, Any], path: Path) -> None:
    """Write `payload` with its digest (`payload_digest`), computed from exactly what is written."""
    try:
        torch.save({**payload, DIGEST_KEY: payload_digest(payload)}, path)
    except (OSError, RuntimeError) as error:  # torch reports a failed write (disk full) as RuntimeError
        free = shutil.disk_usage(path.parent).free
        reason = " ".join(str(error).split())[:200]
        folder = path.parent.parent if path.parent.name.startswith(".partial-") else path.parent  # the output's
        raise PipelineError(
            f"could not write the checkpoint {path} ({reason}); {free / 2**20:.1f} MiB are free on its file system. "
            f"Free space (or fix permissions) in {folder}/ and run again. Nothing was written."
        ) from None


def checkpoint_digest(path: Path) -> str:
    """SHA-256 of the checkpoint file: the model's identity across machines (tag `model.digest`).

    The bytes are reproducible for the same params, data and CPU, and identical wherever the file
    came from through `dvc pull`, so equal digests mean the very same weights were profiled.
    """
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@dataclass(frozen=True)
class Checkpoint:
    model: LabNet  # in eval mode, on the CPU
    data_digest: str
    train_params: dict[str, Any]
    metrics: dict[str, float]


_FIX = "Restore it with `dvc checkout models/model.pt`, or retrain with `dvc repro -f train`."
_FORMAT_1_FIX = (
    "Retrain with `dvc repro -f train` (or, where a checkpoint of the current format is committed, restore it "
    "with `dvc checkout models/model.pt`)."
)


def load_checkpoint(path: Path) -> Checkpoint:
    """Read a checkpoint written by the train stage; clear error when missing, damaged or not ours.

    `weights_only=True` refuses anything but tensors and plain containers (no code runs while
    loading); then the structure, the payload's digest and the model config are checked before the
    network is built, and the weights must match its shapes. Every stage that reads the model (export_graph,
    profile and its timing workers) comes through here, so none runs on weights changed since training.
    """
    try:
        with warnings.catch_warnings():  # garbage may "declare" pickle protocol 191: the error says enough
            warnings.simplefilter("ignore", UserWarning)
            payload = torch.load(path, map_location=host_kind().torch_device(), weights_only=True)
    except FileNotFoundError:
        raise PipelineError(f"{path} is missing: run the train stage first (`dvc repro train`).") from None
    except pickle.UnpicklingError as error:  # damaged bytes, or what weights_only refuses to load
        # torch's own text suggests `weights_only=False`, advice never to follow for an untrusted
        # file: only the unpickler's reason is shown.
        reason = str(error.__context__ or error).split(". Please")[0].strip().splitlines()[0][:200]
        what = (
            "holds objects that would run code when loaded; it was refused"
            if "Unsupported global" in reason
            else "is not a readable checkpoint"
        )
        raise PipelineError(f"{path} {what} ({reason}). {_FIX}") from None
    except Exception as error:  # damaged bytes reach the unpickler's internals
        # Random bytes after a pickle header fail in the unpickler with whatever its stack state
        # gives (IndexError, KeyError, UnicodeDecodeError, ... measured over 2,000 seeds), not only
        # UnpicklingError, so any ordinary exception here means "not readable"; Ctrl-C still passes.
        reason = str(error).splitlines()[0][:200] if str(error) else type(error).__name__
        raise PipelineError(f"{path} is not a readable checkpoint ({reason}). {_FIX}") from None
    if isinstance(payload, dict) and payload.get("format") == 1:
        raise PipelineError(
            f"{path} is a checkpoint of format 1, written before checkpoints carried a digest of their payload: "
            f"its weights cannot be verified, so it is not used. {_FORMAT_1_FIX}"
        )
    if not isinstance(payload, dict) or payload.get("format") != CHECKPOINT_FORMAT:
        raise PipelineError(
            f"{path} is not a checkpoint of format {CHECKPOINT_FORMAT} written by this pipeline's train stage. {_FIX}"
        )
    problem = _structure_problem(payload)
    if problem:
        raise PipelineError(f"{path} is damaged or not written by this pipeline: {problem}. {_FIX}")
    _verify_digest(payload, path)
    description = payload["model"]
    model_config = params_from_section(
        ModelConfig, description["model_config"], f"{path}", _FIX, prefix="model_config."
    )
    check_model_fits_memory(model_config, f"{path} (model_config)", _FIX)
    with torch.device("meta"):  # shapes only: no memory until the weights are assigned
        model = LabNet(model_config, input_shape=IMAGE_SHAPE)
    try:
        model.load_state_dict(payload["state_dict"], assign=True)
    except RuntimeError as error:
        detail = " ".join(str(error).split())[:400]
        raise PipelineError(f"{path} holds weights that do not fit its own model config ({detail}). {_FIX}") from None
    _refuse_diverged(payload["state_dict"], payload["metrics"], f"so {path} is not used")
    model.eval()
    return Checkpoint(
        model=model,
        data_digest=payload["data_digest"],
        train_params=payload["train_params"],
        metrics=payload["metrics"],
    )


def _verify_digest(payload: dict[str, Any], path: Path) -> None:
    try:
        actual = payload_digest(payload)
    except (TypeError, ValueError):  # a field JSON cannot write: not what save_checkpoint digested
        actual = None
    if actual != payload[DIGEST_KEY]:
        raise PipelineError(
            f"{path} does not match the digest written with it (`{DIGEST_KEY}`): its weights or records changed "
            f"after the train stage saved it (a flipped bit on disk, a copy gone wrong, an edit), so it is not used. "
            f"{_FIX}"
        )


def _structure_problem(payload: dict[str, Any]) -> str | None:
    expected: dict[str, type] = {
        DIGEST_KEY: str,
        "state_dict": dict,
        "model": dict,
        "data_digest": str,
        "train_params": dict,
        "metrics": dict,
    }
    for key, kind in expected.items():
        if not isinstance(payload.get(key), kind):
            return f"`{key}` is missing or not a {kind.__name__}"
    if not all(
        isinstance(name, str) and isinstance(tensor, torch.Tensor) for name, tensor in payload["state_dict"].items()
    ):
        return "`state_dict` holds something other than named tensors"
    if any(tensor.dtype != torch.float32 for tensor in payload["state_dict"].values()):
        return "`state_dict` holds tensors that are not float32"
    description = payload["model"]
    if not isinstance(description.get("model_config"), dict):
        return "`model.model_config` is missing"
    if description.get("input_shape") != list(IMAGE_SHAPE):
        return f"`model.input_shape` is {str(description.get('input_shape'))[:60]}, not MNIST's {list(IMAGE_SHAPE)}"
    if not all(isinstance(value, (int, float)) for value in payload["metrics"].values()):
        return "`metrics` holds something other than numbers"
    return None
