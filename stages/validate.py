"""DVC stage `validate` (always runs): check params.yaml and this machine before DVC touches any other stage, and
record the machine (no torch: a fraction of a second).

Every other stage depends on `checks/params.ok`, so `dvc repro`, `dvc repro <stage>` and `dvc exp run -S`
run it first; on bad params it fails and DVC stops before deleting any other stage's outputs or
running any other command. That file's content never changes, so valid edits rerun nothing extra.
`hardware/fingerprint.json` (CPU model, family and kernel-relevant features, GPUs, OS, torch and its CUDA build)
changes only on other hardware: the roofs and profile stages depend on it, training does not.
"""

from pipeline.common.stage_runner import run_stage_process
from pipeline.params.validation import write_params_checked

if __name__ == "__main__":
    run_stage_process("validate", write_params_checked)
