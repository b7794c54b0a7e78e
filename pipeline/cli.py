"""Entry-point wrapper shared by every stage script: user errors and Ctrl-C become exit codes."""

from __future__ import annotations

import sys
from collections.abc import Callable

from pipeline.errors import PipelineError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130  # the shell's convention for SIGINT


def run_stage(name: str, main: Callable[[], None]) -> None:
    """Run a stage's `main`, exiting non-zero with a readable message on user errors or Ctrl-C.

    Programming errors keep their traceback on purpose: those are bugs to report, not inputs to fix.
    """
    try:
        main()
    except PipelineError as error:
        print(f"\nerror in stage '{name}': {error}", file=sys.stderr)
        sys.exit(EXIT_USER_ERROR)
    except KeyboardInterrupt:
        print(f"\nstage '{name}' interrupted; no outputs were written.", file=sys.stderr)
        sys.exit(EXIT_INTERRUPTED)
