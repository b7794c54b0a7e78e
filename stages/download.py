"""DVC stage `download`: fetch and verify MNIST, log it, write data/MNIST atomically."""

from pipeline.common.paths import DATA_ROOT
from pipeline.common.stage_runner import run_stage_process
from pipeline.data.artifacts import log_download
from pipeline.data.mnist import fetch_mnist, mirror_candidates, write_dataset
from pipeline.params.loading import load_params
from pipeline.tracking.lifecycle import open_tracker


def main() -> None:
    params = load_params()
    mirrors = mirror_candidates(params.data)
    with open_tracker("download", params.tracking) as tracker:
        result = fetch_mnist(params.data, mirrors)
        log_download(tracker, params.data, result)
        written = write_dataset(result, DATA_ROOT)
    print(f"MNIST verified (dataset digest {result.dataset_digest[:12]}) -> {written}")


if __name__ == "__main__":
    run_stage_process("download", main)
