"""The registry of device kinds: every module of this package that defines a `KIND` (pipeline.devices.kind), found
by listing the package, so that a module dropped into pipeline/devices/ is a kind without an edit elsewhere.
Torch-free."""

from __future__ import annotations

import functools
import importlib
import pkgutil
from pathlib import Path
from typing import TYPE_CHECKING

from pipeline.devices.kind import DeviceKind

if TYPE_CHECKING:
    import torch

FOLDER = Path(__file__).parent  # pipeline/devices: a dvc.yaml dep of every stage that asks a kind
PACKAGE = "pipeline.devices"


@functools.cache
def device_kinds() -> dict[str, DeviceKind]:
    """Every kind defined in this package, by name, in the order of their names."""
    found: dict[str, DeviceKind] = {}
    for module in sorted(pkgutil.iter_modules([str(FOLDER)]), key=lambda info: info.name):
        kind = getattr(importlib.import_module(f"{PACKAGE}.{module.name}"), "KIND", None)
        if isinstance(kind, DeviceKind):
            if kind.name in found:
                raise ValueError(f"two device kinds are named {kind.name!r} in pipeline/devices/: rename one")
            found[kind.name] = kind
    return found


def device_names() -> tuple[str, ...]:
    return tuple(device_kinds())


def device_kind(name: str) -> DeviceKind:
    """The kind named `name`; a name defined nowhere here (a record made where another kind was defined) is read as
    an accelerator of its own name, so that its rows are still shown."""
    kinds = device_kinds()
    if name in kinds:
        return kinds[name]
    return DeviceKind(
        name=name,
        torch_type=name,
        label=name,
        colour="tab:gray",
        where="a machine that has one",
        on_host=False,
        support="untested",
        auto_rank=None,
        trace_device_type=-1,
        allocator_block_bytes=1,
        matrix_size=2048,
        triad_elements=1 << 25,
        time_ranked_by="self device time",
    )


def kind_of(device: torch.device | str) -> DeviceKind:
    """The kind that owns a torch device's type (`device`, or its type as a string): the kind of that name, else the
    first defined on that type. What a kind does through torch depends on the torch type alone."""
    torch_type = device if isinstance(device, str) else device.type
    kinds = device_kinds()
    if torch_type in kinds:
        return kinds[torch_type]
    return next(kind for kind in kinds.values() if kind.torch_type == torch_type)


def host_kind() -> DeviceKind:
    """The kind that computes on the host's cores, against which the other kinds are compared."""
    return next(kind for kind in device_kinds().values() if kind.on_host and kind.name == kind.torch_type)
