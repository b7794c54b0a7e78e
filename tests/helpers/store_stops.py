"""Stop a tracking store's first creation at its Nth SQL statement, in forked children of one process that imported
MLflow once (seconds saved per stop): `python -m tests.helpers.store_stops '<json>'` with

    {"mode": "pipeline" | "mlflow", "stops": [[statement, signal number], ...], "folders": [...], "count": false}

`pipeline` creates the store as a stage does (pipeline.tracking.store.prepare_experiment); `mlflow` as MLflow itself
does, in place (an `mlflow ui`, or this pipeline before it built stores aside). Each child creates
`<folder>/mlflow.db` and sends itself the signal right before its Nth statement. With "count": true it creates one
store in the first folder unstopped. Prints one JSON line: the statement count, or each child's exit status
(negative: the signal that ended it).
"""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path


def _create(mode: str, folder: Path, stop_at: int, signum: int) -> int:
    import sqlalchemy
    from mlflow import MlflowClient

    from pipeline.tracking.store import prepare_experiment

    count = 0

    def before_statement(*_: object) -> None:
        nonlocal count
        count += 1
        if count == stop_at:
            os.kill(os.getpid(), signum)

    sqlalchemy.event.listen(sqlalchemy.engine.Engine, "before_cursor_execute", before_statement)
    uri = f"sqlite:///{folder / 'mlflow.db'}"
    if mode == "mlflow":
        MlflowClient(uri).search_experiments()
    else:
        prepare_experiment(uri, "store-stops", folder)
    return count


def main(request: dict[str, object]) -> list[int] | int:
    import mlflow.store.db.utils  # noqa: F401  (imported before forking: the children share it)

    import pipeline.tracking.store  # noqa: F401

    folders = [Path(str(folder)) for folder in request["folders"]]  # type: ignore[attr-defined]
    if request.get("count"):
        return _create(str(request["mode"]), folders[0], 0, 0)
    statuses = []
    for folder, (stop_at, signum) in zip(folders, request["stops"], strict=True):  # type: ignore[call-overload]
        folder.mkdir(parents=True, exist_ok=True)
        child = os.fork()
        if child == 0:
            # The disposition the stop needs, whatever this process inherited: a suite started as a background job
            # passes SIGINT down ignored, and CPython then installs no KeyboardInterrupt handler.
            signal.signal(signal.SIGINT, signal.default_int_handler)
            try:
                _create(str(request["mode"]), folder, int(stop_at), int(signum))
                os._exit(0)
            except BaseException:
                os._exit(1)
        _, status = os.waitpid(child, 0)
        statuses.append(-os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status))
    return statuses


if __name__ == "__main__":
    print(json.dumps(main(json.loads(sys.argv[1]))))
