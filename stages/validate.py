"""DVC stage `validate`: check params.yaml before DVC touches any other stage (no torch: ~0.3 s).

Every other stage depends on its output, so `dvc repro`, `dvc repro <stage>` and `dvc exp run -S`
run it first; on bad params it fails and DVC stops before deleting any other stage's outputs or
running any other command. The output's content never changes, so valid edits rerun nothing extra.
"""

from pipeline.common.stage_runner import run_stage
from pipeline.params.validation import write_params_checked

if __name__ == "__main__":
    run_stage("validate", write_params_checked)
