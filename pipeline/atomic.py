"""All-or-nothing outputs: write every file of a stage to a temp folder, rename them all at the end.

A stage that fails or is interrupted before `commit()` leaves none of its outputs behind, so DVC
never sees a half-written checkpoint or a metrics file from a run that did not finish.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from types import TracebackType
from typing import Any


class AtomicOutputs:
    """Use as a context manager: `staged(path)` gives a temp path; a clean exit renames them all.

    A staged file keeps its final name, inside a hidden `.partial-<pid>` folder beside its final
    place (same file system, so the rename is atomic), so it can be logged as an artifact under its
    real name before the outputs are committed.
    """

    def __init__(self) -> None:
        self._staged: dict[Path, Path] = {}

    def staged(self, final: Path) -> Path:
        final = Path(final)
        folder = final.parent / f".partial-{os.getpid()}"
        folder.mkdir(parents=True, exist_ok=True)
        temporary = folder / final.name
        self._staged[final] = temporary
        return temporary

    def write_text(self, final: Path, text: str) -> None:
        self.staged(final).write_text(text)

    def write_json(self, final: Path, payload: Any) -> None:
        self.write_text(final, json.dumps(payload, indent=2, sort_keys=True) + "\n")

    def commit(self) -> None:
        for final, temporary in self._staged.items():
            os.replace(temporary, final)
        self._remove_folders()

    def discard(self) -> None:
        self._remove_folders()

    def _remove_folders(self) -> None:
        for folder in {temporary.parent for temporary in self._staged.values()}:
            shutil.rmtree(folder, ignore_errors=True)
        self._staged.clear()

    def __enter__(self) -> AtomicOutputs:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if kind is None:
            self.commit()
        else:
            self.discard()
