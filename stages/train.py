"""DVC stage `train`: train the lab CNN on in-memory MNIST, log it, write checkpoint + metrics atomically."""

import sys

from pipeline.common.allocator import tune_allocator
from pipeline.common.stage_runner import run_stage_process
from pipeline.params.loading import load_params
from pipeline.training.stage import train_and_register


def main() -> None:
    tune_allocator()  # before any tensor: pipeline.common.allocator says why
    trained = train_and_register(load_params())
    print(trained.summary)
    if trained.warning:
        print(f"Warning: {trained.warning}.", file=sys.stderr)


if __name__ == "__main__":
    run_stage_process("train", main)
