"""Energy counters: what a device kind reads its energy from (pipeline.devices.<kind>.energy_source names one),
each opened by its name with `open_counter`. NVML's total-energy counter on an NVIDIA GPU, RAPL's package counters
on a CPU, and a steady stand-in for machines without one. A counter that cannot be read is `Unavailable` with a
one-sentence reason: never zero energy.

Torch-free; pynvml is imported only where a GPU counter is opened.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any, Protocol

RAPL_ROOT = Path("/sys/class/powercap")
RAPL_NOT_EXPOSED = "not exposed by this machine"  # VMs, and machines without the powercap driver
_RAPL_PACKAGE_ZONE = re.compile(r"intel-rapl:(\d+)")  # top-level zones; intel-rapl:0:0 and on are their parts


@dataclass(frozen=True)
class Unavailable:
    """Why an energy figure could not be had, in one sentence a reader understands (it stands in for a number)."""

    reason: str


class EnergyCounter(Protocol):
    """A monotonically increasing energy count in mJ that may move only once per update period."""

    @property
    def name(self) -> str:
        """What is counted, for messages and records (`NVIDIA H100 80GB HBM3 (GPU 0)`, `package-0`)."""
        ...

    def millijoules(self) -> int: ...


class NvmlCounter:
    """A GPU's total-energy counter (nvmlDeviceGetTotalEnergyConsumption: mJ since the driver loaded).

    Made by `open_gpu_counter`; it holds one NVML initialisation (NVML counts them) until `close`.
    """

    def __init__(self, nvml: Any, handle: Any, index: int, name: str) -> None:
        self._nvml = nvml
        self._handle = handle
        self._open = True
        self.index = index
        self.name = name

    def millijoules(self) -> int:
        return int(self._nvml.nvmlDeviceGetTotalEnergyConsumption(self._handle))

    def close(self) -> None:
        if self._open:
            self._open = False
            self._nvml.nvmlShutdown()

    def __enter__(self) -> NvmlCounter:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


def _init_nvml() -> Any:
    """The pynvml module, initialised (the caller shuts it down), or Unavailable saying why NVML is not there."""
    try:
        import pynvml  # type: ignore[import-untyped]
    except ImportError as error:
        return Unavailable(f"NVML could not be loaded: the nvidia-ml-py package is not importable ({error})")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as error:
        if error.value == pynvml.NVML_ERROR_LIBRARY_NOT_FOUND:
            return Unavailable("NVML could not be loaded: no NVIDIA driver library (libnvidia-ml.so.1) on this machine")
        return Unavailable(f"NVML could not be loaded: {error}")
    return pynvml


def _gpu_handle(nvml: Any, index: int) -> Any:
    """GPU `index`'s NVML handle, or Unavailable saying why there is none."""
    try:
        return nvml.nvmlDeviceGetHandleByIndex(index)
    except nvml.NVMLError as error:
        try:
            count = int(nvml.nvmlDeviceGetCount())
        except nvml.NVMLError:
            return Unavailable(f"NVML could not open GPU {index} (NVML: {error})")
        return Unavailable(f"NVML could not open GPU {index}: it sees {count} GPU(s) (NVML: {error})")


def open_gpu_counter(index: int) -> NvmlCounter | Unavailable:
    """GPU `index`'s energy counter, read once to check it works; Unavailable (never an exception) where there is
    no NVML, no such GPU, or no counter on it (NVML has it on Volta and newer)."""
    nvml = _init_nvml()
    if isinstance(nvml, Unavailable):
        return nvml
    handle = _gpu_handle(nvml, index)
    if isinstance(handle, Unavailable):
        nvml.nvmlShutdown()
        return handle
    try:
        name = f"{nvml.nvmlDeviceGetName(handle)} (GPU {index})"
        nvml.nvmlDeviceGetTotalEnergyConsumption(handle)
    except nvml.NVMLError as error:
        nvml.nvmlShutdown()
        if error.value in (nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_FUNCTION_NOT_FOUND):
            return Unavailable(f"this GPU or driver has no total-energy counter (NVML: {error})")
        return Unavailable(f"the energy counter of GPU {index} could not be read (NVML: {error})")
    return NvmlCounter(nvml, handle, index, name)


@dataclass(frozen=True)
class GpuPowerState:
    """What sets a GPU's energy per step besides the work: the GPU and driver, its power cap and its clocks.

    The clocks are read at one moment (boost and power capping move them), so read them while the step runs.
    None: NVML does not report that value for this GPU.
    """

    index: int
    name: str
    driver_version: str
    power_limit_w: float | None  # enforced: the lowest of the limits set by the user, the board and the firmware
    sm_clock_mhz: int | None
    memory_clock_mhz: int | None


def gpu_power_state(index: int) -> GpuPowerState | Unavailable:
    """GPU `index`'s state through NVML, or Unavailable where there is no NVML or no such GPU."""
    nvml = _init_nvml()
    if isinstance(nvml, Unavailable):
        return nvml
    try:
        handle = _gpu_handle(nvml, index)
        if isinstance(handle, Unavailable):
            return handle

        def optional(read: Callable[[], Any]) -> int | None:
            try:
                return int(read())
            except nvml.NVMLError:
                return None

        try:
            name = str(nvml.nvmlDeviceGetName(handle))
            driver = str(nvml.nvmlSystemGetDriverVersion())
        except nvml.NVMLError as error:
            return Unavailable(f"NVML could not name GPU {index} or its driver (NVML: {error})")
        limit_mw = optional(lambda: nvml.nvmlDeviceGetEnforcedPowerLimit(handle))
        return GpuPowerState(
            index=index,
            name=name,
            driver_version=driver,
            power_limit_w=None if limit_mw is None else limit_mw / 1000,
            sm_clock_mhz=optional(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_SM)),
            memory_clock_mhz=optional(lambda: nvml.nvmlDeviceGetClockInfo(handle, nvml.NVML_CLOCK_MEM)),
        )
    finally:
        nvml.nvmlShutdown()


class RaplCounter:
    """A CPU package's RAPL energy counter (powercap's energy_uj, µJ), in mJ and increasing across its wrap-around.

    energy_uj wraps to 0 past max_energy_range_uj (a few hundred kJ: minutes at full power), so a wrap is seen only
    if readings are less than one range apart; measure_energy reads at every window.
    """

    def __init__(self, zone: Path, name: str, max_range_uj: int, first_uj: int) -> None:
        self.zone = zone
        self.name = name
        self.max_range_uj = max_range_uj
        self._last_uj = first_uj
        self._total_uj = first_uj

    def millijoules(self) -> int:
        raw = _read_int(self.zone / "energy_uj")
        if raw < self._last_uj:
            self._total_uj += self.max_range_uj - self._last_uj + raw
        else:
            self._total_uj += raw - self._last_uj
        self._last_uj = raw
        return self._total_uj // 1000


def _read_int(path: Path) -> int:
    with open(path) as file:
        text = file.read()
    try:
        return int(text.strip())
    except ValueError:
        raise ValueError(f"not a number: {text.strip()!r}") from None


def _unreadable(path: Path, error: OSError | ValueError) -> Unavailable:
    if isinstance(error, PermissionError):
        why = "permission"
    elif isinstance(error, OSError):
        why = error.strerror or str(error)
    else:
        why = str(error)
    return Unavailable(f"not readable ({why}): {path}")


def rapl_counters(root: Path = RAPL_ROOT) -> list[RaplCounter] | Unavailable:
    """The energy counters of the CPU packages (top-level RAPL zones named package-N), each read once.

    Unavailable when the machine exposes none, or when any package's counter cannot be read: the kernel lets only
    root read energy_uj (`not readable (permission)`), and a sum missing one package would undercount. Other
    top-level zones are left out: psys counts the whole platform, packages included.
    """
    if not root.is_dir():
        return Unavailable(RAPL_NOT_EXPOSED)
    zones = []
    for entry in root.iterdir():
        match = _RAPL_PACKAGE_ZONE.fullmatch(entry.name)
        if match:
            zones.append((int(match.group(1)), entry))
    counters: list[RaplCounter] = []
    for _, zone in sorted(zones):
        path = zone / "name"
        try:
            name = path.read_text().strip()
            if not name.startswith("package"):
                continue
            path = zone / "max_energy_range_uj"
            max_range_uj = _read_int(path)
            path = zone / "energy_uj"
            first_uj = _read_int(path)
        except (OSError, ValueError) as error:
            return _unreadable(path, error)
        counters.append(RaplCounter(zone, name, max_range_uj, first_uj))
    if not counters:
        return Unavailable(RAPL_NOT_EXPOSED)
    return counters


class SummedCounter:
    """Several counters read as one (the packages of a multi-socket CPU)."""

    def __init__(self, counters: Sequence[EnergyCounter], name: str) -> None:
        self.counters = tuple(counters)
        self.name = name

    def millijoules(self) -> int:
        return sum(counter.millijoules() for counter in self.counters)


class SteadyCounter:
    """A stand-in for machines without a counter (tests, dry runs): `watts` of steady power on the monotonic clock,
    counted up to the last multiple of `period_s`, as a counter that updates once per period does."""

    def __init__(self, watts: float, period_s: float) -> None:
        self.watts = watts
        self.period_s = period_s
        self.name = f"a stand-in counter of {watts:g} W updating every {period_s:g} s"

    def millijoules(self) -> int:
        return round(math.floor(time.monotonic() / self.period_s) * self.period_s * self.watts * 1000)


def open_counter(source: str) -> EnergyCounter | Unavailable:
    """The counter a profile's timing processes read: `gpu:<index>` (NVML), `rapl` (every CPU package, summed), or
    `steady:<watts>:<period_s>` (SteadyCounter, for machines without one)."""
    if source.startswith("steady:"):
        watts, period_s = source.removeprefix("steady:").split(":")
        return SteadyCounter(float(watts), float(period_s))
    if source.startswith("gpu:"):
        return open_gpu_counter(int(source.removeprefix("gpu:")))
    if source == "rapl":
        found = rapl_counters()
        if isinstance(found, Unavailable):
            return found
        names = ", ".join(counter.name for counter in found)
        return SummedCounter(found, f"RAPL energy of the CPU package(s) ({names}: every core, idle ones included)")
    raise ValueError(f"unknown energy counter {source!r}")
