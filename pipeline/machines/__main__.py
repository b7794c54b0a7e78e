"""`python -m pipeline.machines`: the machines report (pipeline.machines.command)."""

from pipeline.machines.command import run

if __name__ == "__main__":
    run()
