"""DVC stage `roofs`: this machine's two roofs, fp32 matmul FLOP/s and memory bandwidth, measured once.

Its deps are the hardware fingerprint and the profile's devices and threads, so DVC runs it again only on
other hardware (or another thread count); every profile stage reads `hardware/roofs.json` instead of measuring
a peak of its own (one per combination would disagree with each other), and the report draws both roofs.
"""

import json

import torch
from tqdm import tqdm

from pipeline.common.allocator import tune_allocator
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import HARDWARE_FINGERPRINT, HARDWARE_ROOFS
from pipeline.common.stage_runner import run_stage_process
from pipeline.params.loading import load_params
from pipeline.profiling.peak import DRIFT_WINDOWS, measure_roofs
from pipeline.records.roofs import MachineRoofs, write_roofs
from pipeline.records.statistics import load_average, measurement_conditions
from pipeline.tracking.lifecycle import open_tracker
from pipeline.tracking.tags import hardware_tags
from pipeline.training.runtime import hardware_description, select_device


def main() -> None:
    tune_allocator()  # before any tensor, as in the profile stages whose ceilings these are
    params = load_params()
    config = params.profile
    devices = {name: select_device(name, param="profile.devices") for name in config.devices}
    if config.threads:
        torch.set_num_threads(config.threads)
    fingerprint = json.loads(HARDWARE_FINGERPRINT.read_text())
    with open_tracker("roofs", params.tracking) as tracker, AtomicOutputs() as outputs:
        tracker.set_tags(hardware_tags(hardware_description(devices[config.devices[0]])))
        tracker.log_params(
            {
                "threads": torch.get_num_threads(),
                "devices": ",".join(config.devices),
                "drift_probe_s": config.drift_probe_s,
            }
        )
        load_before = load_average()
        with tqdm(
            total=len(devices) * (DRIFT_WINDOWS if config.drift_probe_s > 0 else 0),
            desc="roofs and drift probe" if config.drift_probe_s > 0 else "roofs",
            unit="window",
        ) as bar:
            measured = tuple(
                measure_roofs(device, drift_probe_s=config.drift_probe_s, progress=bar.update, name=name)
                for name, device in devices.items()
            )
        conditions = measurement_conditions(load_before, torch.get_num_threads())
        roofs = MachineRoofs(fingerprint=fingerprint, devices=measured)
        outputs.write_text(HARDWARE_ROOFS, write_roofs(roofs))
        for device in measured:
            tracker.log_summary(device.summary_metrics(), prefix=f"roofs/{device.device}/")
    probed = config.drift_probe_s > 0
    busy = conditions.warning("the roofs and the speed drift" if probed else "the roofs")
    if busy:
        measured_again = "this drift" if probed else "these roofs"
        print(f"Warning: {busy}; the report states {measured_again} until `dvc repro -f roofs` measures them again.")
    for device in measured:
        print(f"{device.summary_line()} -> {HARDWARE_ROOFS}")


if __name__ == "__main__":
    run_stage_process("roofs", main)
