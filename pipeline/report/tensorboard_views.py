"""TensorBoard's own views of this project's current training, for the hand-in's 截图 cells (the handout's steps 3-4):
its GRAPHS view of the model's dataflow graph (the `export_graph` stage's run) and its scalars, loss and accuracy
of training and test (the `train` stage's run), photographed in headless Chromium from a real `tensorboard` serving
those two runs' event files.

    make handin-views      # this, then `dvc repro report`, which puts them in the hand-in

A picture is taken only once its page shows what the hand-in says it shows (`View.shows`); a page that never does is
not photographed and the command fails, naming what it lacked. The pictures go to `views/` (VIEWS) with
`views.json`, which records the digests of the training's metrics and the graph picture they go with: the report
stage embeds them only while both are still the project's current ones (`current_views`), and otherwise says they
show an earlier training. Where no Chromium is installed, the command says how to get one and exits 1; the hand-in
then says how to add the views.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from mlflow import MlflowClient

from pipeline.common.browser import CHROMIUM, Page, chromium_page, closed_port
from pipeline.common.errors import PipelineError
from pipeline.common.outputs import AtomicOutputs
from pipeline.common.paths import GRAPH_DOT, GRAPH_SVG, MODEL_CHECKPOINT, TRAIN_METRICS
from pipeline.common.stage_runner import run_stage
from pipeline.params.loading import load_params
from pipeline.tracking.lineage import file_md5, producer_run
from pipeline.tracking.store import project_root, tracking_uri

VIEWS = Path("views")
RECORD = VIEWS / "views.json"
GRAPH_VIEW, SCALARS_VIEW = VIEWS / "tensorboard-graph.png", VIEWS / "tensorboard-scalars.png"
# The outputs of the training and the graph the views show, by digest (each a dep of the report stage).
SHOWS_OUTPUTS = {"train_metrics_md5": TRAIN_METRICS, "graph_svg_md5": GRAPH_SVG}
INSTALL_CHROMIUM = "install Chromium (Debian: `apt-get install chromium`), then run `make handin-views`"
# Any element, however deep in shadow roots (TensorBoard's graph is drawn there).
FIND_DEEP = """(function find(node, selector) {
  const hit = node.querySelector ? node.querySelector(selector) : null;
  if (hit) return hit;
  for (const child of [node.shadowRoot, ...(node.children || [])]) {
    const found = child ? find(child, selector) : null;
    if (found) return found;
  }
  return null;
})"""


# The innermost element whose own text is `text`, however deep in shadow roots (TensorBoard's controls sit there).
FIND_TEXT = """(function find(node, text) {
  for (const child of [node.shadowRoot, ...(node.children || [])]) {
    const found = child ? find(child, text) : null;
    if (found) return found;
  }
  return node.textContent && node.textContent.trim() === text && node.click ? node : null;
})"""


@dataclass(frozen=True)
class View:
    path: Path
    fragment: str  # TensorBoard's page: `#graphs`, `#scalars&...`
    loaded: tuple[str, ...]  # texts that say the page has loaded, before `then`
    shows: tuple[str, ...]  # texts the page shows once ready: what the hand-in says the picture shows
    then: Callable[[Page], None] = lambda page: None


def open_node(page: Page, name: str, until: str, timeout_s: float = 60) -> None:
    """Double-click the graph's node `name` (its full name: `LabNet/Sequential[features]`) until the page shows
    `until`. The graph zooms to fit after each change, so a node found while it moves can be missed: the
    double-click is repeated at the node's place then."""
    where = (
        f"(() => {{ const node = {FIND_DEEP}(document, 'g.node[data-name={json.dumps(name)}]');"
        " if (!node) return null; const r = node.getBoundingClientRect();"
        " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
    )
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        box = page.evaluate(where)
        if box:
            for kind in ("mousePressed", "mouseReleased"):
                page.call("Input.dispatchMouseEvent", type=kind, x=box[0], y=box[1], button="left", clickCount=2)
        if not page.wait_for((until,), timeout_s=10)[1]:
            return


def open_labnet(page: Page) -> None:
    """The model's node opened, as the lab guide tells the student: its two blocks show."""
    open_node(page, "LabNet", "Subgraph")


def open_layers(page: Page) -> None:
    """The model's node and both its blocks opened: every layer shows, convolutions to the last linear layer."""
    open_labnet(page)
    open_node(page, "LabNet/Sequential[features]", "Conv2d[conv1]")
    open_node(page, "LabNet/Sequential[classifier]", "Linear[fc1]")
    # The whole graph in the picture (opening a node zooms to it), nothing left selected.
    page.evaluate(f"(() => {{ const fit = {FIND_TEXT}(document, 'Fit to screen'); if (fit) fit.click(); }})()")
    page.evaluate("window.getSelection().removeAllRanges()")


SHOWN = (
    View(
        GRAPH_VIEW,
        "#graphs",
        ("Main Graph", "LabNet"),
        ("Conv2d[conv1]", "MaxPool2d[pool]", "Linear[fc1]"),
        open_layers,
    ),
    # The scalars dashboard, its tag filter on the loss and accuracy of training and test.
    View(
        SCALARS_VIEW,
        "#scalars&tagFilter=" + urllib.parse.quote("^(train|test)/(loss|accuracy)$", safe=""),
        ("train/loss",),
        ("train/loss", "test/loss", "train/accuracy", "test/accuracy"),
    ),
)


@contextlib.contextmanager
def running_tensorboard(logdir: Path, timeout_s: float = 90) -> Iterator[str]:
    """`tensorboard --logdir logdir` on a free localhost port, as the README starts it; its URL once it lists runs."""
    port = closed_port()
    command = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", "127.0.0.1"]
    command += ["--port", str(port), "--load_fast", "false", "--reload_interval", "1"]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            with contextlib.suppress(OSError), urllib.request.urlopen(f"{url}/data/runs", timeout=2) as answer:
                if json.loads(answer.read()):
                    break
            if server.poll() is not None or time.monotonic() > deadline:
                server.kill()
                said = server.communicate()[1] or ""
                raise PipelineError(
                    f"TensorBoard did not serve {logdir} within {timeout_s:.0f} s; it said: {said[-500:]}"
                )
            time.sleep(0.5)
        yield url
    finally:
        server.terminate()
        server.wait(timeout=30)


def current_runs(root: Path, experiment_name: str) -> dict[str, str]:
    """The run ids of the `train` and `export_graph` runs whose outputs are the project's checkpoint and graph."""
    client = MlflowClient(tracking_uri(root))
    experiment = client.get_experiment_by_name(experiment_name)
    found = {}
    for stage, output in (("train", MODEL_CHECKPOINT), ("export_graph", GRAPH_DOT)):
        run = producer_run(client, experiment.experiment_id, stage, output, root) if experiment else None
        if run is None:
            raise PipelineError(
                f"no MLflow run of this store wrote {output}: run `dvc repro export_graph` here first (outputs pulled "
                "from a DVC remote have no event files on this machine)."
            )
        found[stage] = run.info.run_id
    return found


def take(page: Page, url: str, view: View, into: Path) -> list[str]:
    """`view` photographed into `into` once its page shows what it should; the texts it still lacked (then no
    picture)."""
    _, lacking = page.open_until(url + "/" + view.fragment, view.loaded)
    if not lacking:
        view.then(page)
        _, lacking = page.wait_for(view.shows)
    if not lacking:
        # The pointer away from the charts (a tooltip would hide one), then the charts and the graph settle.
        page.call("Input.dispatchMouseEvent", type="mouseMoved", x=1, y=1)
        time.sleep(3)
        page.screenshot(into)
    return lacking


def main() -> None:
    if CHROMIUM is None:
        raise PipelineError(
            f"no Chromium on PATH: the views are photographed in headless Chromium; {INSTALL_CHROMIUM}."
        )
    root = project_root()
    tracking = load_params().tracking
    logs = root / tracking.tensorboard_dir
    runs = current_runs(root, tracking.experiment)
    with tempfile.TemporaryDirectory(prefix="tensorboard-views-") as scratch:
        current = Path(scratch) / "runs"
        for stage, run_id in runs.items():  # these two runs alone: older ones would crowd the pages
            for folder in (logs / stage).glob(f"*-{run_id[:8]}"):
                shutil.copytree(folder, current / stage / folder.name)
        with (
            running_tensorboard(current) as url,
            chromium_page(Path(scratch) / "chromium", "1400,900") as page,
            AtomicOutputs() as outputs,
        ):
            for view in SHOWN:
                lacking = take(page, url, view, outputs.staged(view.path))
                if lacking:
                    raise PipelineError(
                        f"TensorBoard's page {view.fragment} never showed {lacking}: {view.path} was not taken. "
                        "Check `tensorboard --logdir runs` in a browser."
                    )
            record = {
                **{key: file_md5(path) for key, path in SHOWS_OUTPUTS.items()},
                "runs": runs,
                "views": [view.path.name for view in SHOWN],
            }
            outputs.write_text(RECORD, json.dumps(record, indent=2) + "\n")
    print(f"TensorBoard's views written to {VIEWS}/; `dvc repro report` puts them in the hand-in.")


def current_views() -> tuple[Path, Path] | str | None:
    """The graph and scalars views where they go with the project's current training and graph; where views exist
    but show an earlier training, the output that changed since (str); None where none were taken."""
    if not RECORD.is_file():
        return None
    record = json.loads(RECORD.read_text())
    paths = (GRAPH_VIEW, SCALARS_VIEW)
    if not all(path.is_file() for path in paths):
        return None
    for key, path in SHOWS_OUTPUTS.items():
        if not path.is_file() or record.get(key) != file_md5(path):
            return str(path)
    return paths


def view_runs() -> tuple[str, str]:
    """The MLflow runs (short ids) of the training and the graph export whose event files the views show."""
    runs = json.loads(RECORD.read_text()).get("runs", {})
    return str(runs.get("train", ""))[:8], str(runs.get("export_graph", ""))[:8]


if __name__ == "__main__":
    run_stage("handin-views", main)
