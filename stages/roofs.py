"""DVC stage `roofs`: this machine's two roofs, fp32 matmul FLOP/s and memory bandwidth, measured once.

Its deps are the hardware fingerprint and the profile's devices and threads, so DVC runs it again only on
other hardware (or another thread count); every profile stage reads `hardware/roofs.json` instead of measuring
a peak of its own (one `dvc repro` had measured six, from 99 to 193 GFLOP/s), and the report draws both roofs.
"""

import json

import torch
from tqdm import tqdm

from pipeline.common.allocator import tune_allocator
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import HARDWARE_FINGERPRINT, HARDWARE_ROOFS
from pipeline.common.stage_runner import run_stage
from pipeline.params.loading import load_params
from pipeline.profiling.peak import DRIFT_WINDOWS, measure_roofs
from pipeline.profiling.roofs import MachineRoofs, write_roofs
from pipeline.profiling.statistics import load_average, measurement_conditions
from pipeline.tracking.tags import hardware_tags
from pipeline.tracking.tracker import open_tracker
from pipeline.training.runtime import hardware_description, select_device


def main() -> None:
    tune_allocator()  # before any tensor, as in the profile stages whose ceilings these are
    params = load_params()
    config = params.profile
    devices = [select_device(device, param="profile.devices") for device in config.devices]
    if config.threads:
        torch.set_num_threads(config.threads)
    fingerprint = json.loads(HARDWARE_FINGERPRINT.read_text())
    with open_tracker("roofs", params.tracking) as tracker, AtomicOutputs() as outputs:
        tracker.set_tags(hardware_tags(hardware_description(devices[0])))
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
            desc="roofs and drift probe",
            unit="window",
        ) as bar:
            measured = tuple(
                measure_roofs(device, drift_probe_s=config.drift_probe_s, progress=bar.update) for device in devices
            )
        conditions = measurement_conditions(load_before, torch.get_num_threads())
        roofs = MachineRoofs(fingerprint=fingerprint, devices=measured)
        outputs.write_text(HARDWARE_ROOFS, write_roofs(roofs))
        for device in measured:
            tracker.log_summary(
                {
                    "matmul_gflops_per_s": device.matmul_gflops_per_s.best,
                    "matmul_gflops_per_s_median": device.matmul_gflops_per_s.median,
                    "triad_gb_per_s": device.triad_gb_per_s.best,
                    "triad_gb_per_s_median": device.triad_gb_per_s.median,
                    "ridge_flops_per_byte": device.ridge_flops_per_byte,
                    "speed_drift_pct": device.speed_drift.half_width_pct,
                    **{
                        f"matmul_gflops_per_s_{kernel.kernel.split()[0].replace('.', '_').lower()}": (
                            kernel.gflops_per_s.best
                        )
                        for kernel in device.matmul_kernels
                    },
                },
                prefix=f"roofs/{device.device}/",
            )
    busy = conditions.warning()
    if busy:
        print(
            f"Warning: {busy.replace('step times', 'the roofs and the speed drift')}: every profile interval "
            "includes this drift until `dvc repro -f roofs` measures it again."
        )
    for device in measured:
        print(
            f"{device.device}: {device.matmul_gflops_per_s.best:.1f} GFLOP/s through {device.matmul_kernel} (median "
            f"{device.matmul_gflops_per_s.median:.1f}"
            + "".join(
                f"; {kernel.kernel} {kernel.gflops_per_s.best:.1f}"
                for kernel in device.matmul_kernels
                if kernel.kernel != device.matmul_kernel
            )
            + f"), {device.triad_gb_per_s.best:.1f} GB/s (median "
            f"{device.triad_gb_per_s.median:.1f}); ridge at {device.ridge_flops_per_byte:.1f} FLOP/byte; speed "
            f"drift ±{device.speed_drift.half_width_pct:.1f} % -> {HARDWARE_ROOFS}"
        )


if __name__ == "__main__":
    run_stage("roofs", main)
