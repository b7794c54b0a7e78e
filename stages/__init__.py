"""One thin entry script per DVC stage (`python -m stages.<name>`); the work is in the pipeline package.

Imported first when a stage starts: before the stage's own imports (torch alone takes seconds), SIGTERM gets the
stage's handler and a Ctrl-C or SIGTERM that lands during those imports ends the stage with one line instead of a
traceback (pipeline.common.interrupts; nothing has been written or logged yet). Imported by anything else (the
tests call some stages' `main`), it changes nothing.
"""

import os
import sys
from types import TracebackType

from pipeline.common.interrupts import Terminated, install_handlers


def _stage_module() -> str | None:
    """`train` when this process is `python -m stages.train`, else None."""
    arguments: list[str] = list(getattr(sys, "orig_argv", ()))
    if "-m" in arguments[:-1]:
        module = arguments[arguments.index("-m") + 1]
        if module.startswith(f"{__name__}."):
            return module.removeprefix(f"{__name__}.")
    return None


def _interrupted_at_start_up(kind: type[BaseException], error: BaseException, trace: TracebackType | None) -> None:
    if not issubclass(kind, KeyboardInterrupt):
        sys.__excepthook__(kind, error, trace)
        return
    how, code = ("terminated (SIGTERM)", 143) if issubclass(kind, Terminated) else ("interrupted", 130)
    print(f"\nstage '{_STAGE}' {how} while starting; no outputs were written.", file=sys.stderr, flush=True)
    os._exit(code)


_STAGE = _stage_module()
if _STAGE is not None:
    sys.excepthook = _interrupted_at_start_up
    install_handlers(_STAGE)
