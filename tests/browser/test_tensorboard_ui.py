"""TensorBoard's own HParams dashboard, rendered by a real headless Chromium against a real `tensorboard --logdir runs`
(as the README says to start it) over a pipeline's runs: one table with the train run's settings beside its test
accuracy and the profile combinations (issue 25).

The dashboard draws inside shadow roots, which Chromium's `--dump-dom` leaves out, so the page is driven over the
DevTools protocol (websocket-client) and its text read from every shadow root.
"""

from __future__ import annotations

import base64
import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import websocket

from pipeline.params.schema import TrackingConfig
from pipeline.tracking.hparams import SHOWN, train_columns
from pipeline.tracking.tracker import open_tracker
from tests.helpers.servers import closed_port, running_tensorboard

pytestmark = pytest.mark.browser
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
# The page's text, shadow roots included: what a person sees, in document order.
DEEP_TEXT = """(function text(node) {
  let found = node.shadowRoot ? text(node.shadowRoot) : "";
  for (const child of node.childNodes) found += child.nodeType === 3 ? child.textContent + " " : text(child);
  return found;
})(document)"""
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


class Page:
    """One Chromium tab over the DevTools protocol."""

    def __init__(self, socket: websocket.WebSocket) -> None:
        self.socket = socket
        self.calls = 0

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        self.calls += 1
        self.socket.send(json.dumps({"id": self.calls, "method": method, "params": params}))
        while True:
            answer: dict[str, Any] = json.loads(self.socket.recv())
            if answer.get("id") == self.calls:
                return answer.get("result", {})

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")


@pytest.fixture
def chromium(tmp_path: Path) -> Iterator[Page]:
    if CHROMIUM is None:
        pytest.fail("no Chromium on PATH: install Debian's `chromium` package to run the browser tests")
    port = closed_port()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", "--window-size=1600,1000"]
    browser = subprocess.Popen(
        [CHROMIUM, *flags, f"--remote-debugging-port={port}", f"--user-data-dir={tmp_path / 'profile'}", "about:blank"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=2) as response:
                    pages = [target for target in json.loads(response.read()) if target["type"] == "page"]
                if pages:
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, "Chromium's DevTools did not answer within 60 s"
            time.sleep(0.3)
        # No Origin header, as a DevTools client that is not a web page: Chromium (150 here) refuses a websocket whose
        # Origin it was not started to allow (--remote-allow-origins), and websocket-client sends one by default.
        socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        try:
            yield Page(socket)
        finally:
            socket.close()
    finally:
        browser.terminate()
        browser.wait(timeout=30)


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
