"""params.yaml read strictly (UTF-8, size-bounded, no aliases, no duplicate keys), parsed, and held
against this machine's memory.
"""

from __future__ import annotations

import os
import typing
from pathlib import Path
from typing import Any

import ruamel.yaml
import ruamel.yaml.error
import yaml

from pipeline.common.credentials import redact
from pipeline.common.errors import PipelineError
from pipeline.params.memory import check_params_fit_memory
from pipeline.params.parsing import RESTORE_HINT, params_from_mapping, show_value
from pipeline.params.schema import Params

DEFAULT_PARAMS_FILE = Path("params.yaml")
# Where a student logs on a class server (README: "A class on one server"): MLflow's own variable for the
# experiment, and ours for the registered model. `tracking.*` is no DVC dependency, so these rerun nothing.
TRACKING_OVERRIDES = {"MLFLOW_EXPERIMENT_NAME": "experiment", "LAB_REGISTERED_MODEL": "registered_model"}
# params.yaml is a few kB; a file this large is a mistake (or an attack), and parsing it would be slow.
MAX_PARAMS_BYTES = 1 << 20


def load_params(path: Path = DEFAULT_PARAMS_FILE) -> Params:
    """Read and validate `path`; raise PipelineError listing every problem found.

    $MLFLOW_EXPERIMENT_NAME and $LAB_REGISTERED_MODEL, where set, replace `tracking.experiment` and
    `tracking.registered_model`. Beyond the value checks, the parsed params must fit this machine
    (`pipeline.params.memory`): a model or batch too large for its memory is refused here, naming the key,
    not by a failed allocation.
    """
    raw = read_params_file(Path(path))
    overrides = {key: os.environ[variable] for variable, key in TRACKING_OVERRIDES.items() if os.environ.get(variable)}
    if overrides and isinstance(raw, dict) and isinstance(raw.get("tracking"), dict):
        raw["tracking"].update(overrides)  # checked by the same rules as params.yaml's values
    params = params_from_mapping(raw, source=str(path))
    check_params_fit_memory(params, source=str(path))
    return params


def read_params_file(path: Path) -> Any:
    """The YAML in `path` as plain data: strict (no aliases, no duplicate keys), size-bounded, UTF-8."""
    fix = f"Fix {path} and run again. {RESTORE_HINT}"
    try:
        with path.open("rb") as stream:
            data = stream.read(MAX_PARAMS_BYTES + 1)
    except FileNotFoundError:
        raise PipelineError(
            f"{path} not found. Run the stage from the project root (where params.yaml lives), as `dvc repro` does."
        ) from None
    except OSError as error:  # a directory, unreadable, ...
        raise PipelineError(
            f"{path} cannot be read ({error.strerror}): it must be a readable YAML file. {fix}"
        ) from None
    if len(data) > MAX_PARAMS_BYTES:
        raise PipelineError(
            f"{path} is larger than {MAX_PARAMS_BYTES // 1024} KiB; params.yaml holds a few settings. {fix}"
        )
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[: error.start].count(b"\n") + 1
        raise PipelineError(
            f"{path} is not UTF-8 text: byte {data[error.start]:#04x} on line {line} is not valid UTF-8. "
            f"Save it as UTF-8. {fix}"
        ) from None
    try:
        yaml.load(text, Loader=_StrictLoader)  # refuses aliases and duplicate keys, naming the line
        return _as_dvc_reads(text)
    except (yaml.YAMLError, ruamel.yaml.error.YAMLError) as error:
        raise PipelineError(f"{path} is not valid YAML ({redact(str(error))}). {fix}") from None
    except (ValueError, RecursionError) as error:  # an integer of more than 4300 digits; nesting thousands deep
        raise PipelineError(
            f"{path} holds a value this pipeline cannot read ({show_value(str(error))}). {fix}"
        ) from None


def _as_dvc_reads(text: str) -> Any:
    """The values as DVC reads params.yaml (dvc.utils.serialize.parse_yaml: ruamel's safe loader, YAML 1.2), so the
    stages see the number DVC puts in `${...}` and `dvc params diff` shows: `1e9` is a float (YAML 1.1, PyYAML's,
    reads a string), `yes`/`on` are strings (1.1: booleans), `010` is 10 (1.1: 8)."""
    return ruamel.yaml.YAML(typ="safe").load(text)


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses aliases and duplicate keys.

    Aliases let a few hundred bytes expand to gigabytes once traversed (the "billion laughs"); params
    need none. A duplicate key is almost always an edit gone wrong, and YAML loaders disagree on it:
    PyYAML keeps the last value while DVC's loader refuses the file.
    """

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()  # type: ignore[no-untyped-call]
            problem = f"aliases (*{event.anchor}) are not allowed in params; write the value out"
            raise yaml.composer.ComposerError(None, None, problem, event.start_mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=deep)
            if not isinstance(key, typing.Hashable):
                continue  # SafeLoader itself refuses an unhashable key, with its own message
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    None, None, f"key {show_value(key)} appears twice in one mapping; keep one", key_node.start_mark
                )
            seen.add(key)
        return super().construct_mapping(node, deep=deep)
