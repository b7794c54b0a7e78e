"""TensorBoard's own HParams dashboard, rendered by a real headless Chromium against a real `tensorboard --logdir runs`
(as the README says to start it) over a pipeline's runs: one table with the train run's settings beside its test
accuracy and the profile combinations.

The dashboard draws inside shadow roots, which Chromium's `--dump-dom` leaves out, so the page is driven over the
DevTools protocol (websocket-client) and its text read from every shadow root.
"""

from __future__ import annotations

import base64
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from pipeline.common.browser import CHROMIUM, DEEP_TEXT, NO_CHROMIUM, Page, chromium_page
from pipeline.params.schema import TrackingConfig
from pipeline.tracking.hparams import SHOWN, train_columns
from pipeline.tracking.lifecycle import open_tracker
from tests.helpers.servers import running_tensorboard

pytestmark = pytest.mark.browser
# The table view's column headers (`div.table-header` in vaadin-grid cells; their text, too, may sit in shadow roots).
HEADERS = """(function () {
  const text = (node) => {
    let found = node.shadowRoot ? text(node.shadowRoot) : "";
    for (const child of node.childNodes) found += child.nodeType === 3 ? child.textContent : text(child);
    return found;
  };
  const headers = (node, found) => {
    if (node.shadowRoot) headers(node.shadowRoot, found);
    for (const child of node.children || []) {
      if (child.classList && child.classList.contains("table-header")) found.push(text(child).trim());
      else headers(child, found);
    }
    return found;
  };
  return headers(document, []);
})()"""


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Page]:
    if CHROMIUM is None:
        pytest.fail(NO_CHROMIUM)
    with chromium_page(tmp_path / "profile") as page:
        yield page


def _log_runs(folder: Path) -> None:
    """A train run and two profile runs, logged through the tracker as the stages log them (their HParams rows
    from the real train and profile stages are checked in tests/test_profile.py against a real `tensorboard`)."""
    config = TrackingConfig(experiment="tensorboard-ui", tensorboard_dir="runs", registered_model="unused")
    with pytest.MonkeyPatch.context() as patch:
        patch.chdir(folder)
        patch.delenv("MLFLOW_TRACKING_URI", raising=False)
        patch.delenv("DVC_EXP_NAME", raising=False)
        with open_tracker("train", config, root=folder) as tracker:
            hparams = {name: kind(1) for name, kind in train_columns().items() if not name.endswith("_requested")}
            tracker.log_hparams({**hparams, "train.lr": 0.5}, {"hparam/test_accuracy": 0.9876})
        for name in COMBINATIONS:
            batch, device, mode = name.split("-")
            with open_tracker("profile", config, variant=name, root=folder) as tracker:
                hparams = {"profile.batch_size": int(batch), "profile.device": device, "profile.mode": mode}
                tracker.log_hparams(hparams, {"hparam/per_sample_ms": 0.25 * int(batch)})


COMBINATIONS = ("1-cpu-inference", "64-cpu-train")


def test_hparams_dashboard_shows_train_lr_beside_test_accuracy_and_the_combinations(
    chromium: Page, tmp_path: Path
) -> None:
    _log_runs(tmp_path)
    with running_tensorboard(tmp_path / "runs") as url:
        chromium.call("Page.navigate", url=f"{url}/#hparams")
        deadline = time.monotonic() + 90
        while True:  # the dashboard fetches the table after the page has loaded
            text, headers = chromium.evaluate(DEEP_TEXT) or "", chromium.evaluate(HEADERS) or []
            if ("profile/64-cpu-train" in text and "train.lr" in headers) or time.monotonic() > deadline:
                break
            time.sleep(1)
        screenshot = chromium.call("Page.captureScreenshot")["data"]  # kept for a person: hparams.png
        (tmp_path / "hparams.png").write_bytes(base64.b64decode(screenshot))
    # The columns shown before anything is ticked: what a lab's experiments vary, train.lr among them.
    assert set(SHOWN) <= set(headers), headers
    assert "hparam/test_accuracy" in text and "hparam/per_sample_ms" in text, text[:3000]
    for name in ("train/", "profile/1-cpu-inference", "profile/64-cpu-train", "0.5"):
        assert name in text, text[:3000]
