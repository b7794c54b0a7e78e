"""DVC stage `hardware` (always runs): write this machine's fingerprint for hardware-bound stages.

The file only changes when the machine does (another CPU/GPU, OS, torch or CUDA build), so the
profile stages that depend on it rerun after a move to other hardware and stay cached otherwise.
"""

import json

from pipeline.common.machine import machine_fingerprint
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import HARDWARE_FINGERPRINT
from pipeline.common.stage_runner import run_stage


def main() -> None:
    fingerprint = machine_fingerprint()
    with AtomicOutputs() as outputs:
        outputs.write_json(HARDWARE_FINGERPRINT, fingerprint)
    print(json.dumps(fingerprint, sort_keys=True))


if __name__ == "__main__":
    run_stage("hardware", main)
