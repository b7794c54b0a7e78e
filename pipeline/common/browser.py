"""Headless Chromium driven over its DevTools protocol (websocket-client): a page's text with its shadow roots (which
`--dump-dom` leaves out, and where TensorBoard draws), waiting for what a page should show, and screenshots. The
hand-in's TensorBoard views are taken with it (pipeline.report.tensorboard_views), and the browser tests read pages
with it."""

from __future__ import annotations

import base64
import json
import shutil
import socket
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import websocket


def closed_port() -> int:
    """A localhost port nothing listens on: connections to it are refused at once."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port  # closed again on exit


CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
NO_CHROMIUM = "no Chromium on PATH: install Debian's `chromium` package to run the browser tests"

# The page's text, shadow roots included, styles and scripts left out: what a person sees, in document order.
DEEP_TEXT = """(function text(node) {
  if (node.nodeName === "STYLE" || node.nodeName === "SCRIPT") return "";
  let found = node.shadowRoot ? text(node.shadowRoot) : "";
  for (const child of node.childNodes) found += child.nodeType === 3 ? child.textContent + " " : text(child);
  return found;
})(document)"""


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
                result: dict[str, Any] = answer.get("result", {})
                return result

    def evaluate(self, expression: str) -> Any:
        return self.call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

    def text(self) -> str:
        """The page's text, shadow roots included, its whitespace collapsed."""
        return " ".join(str(self.evaluate(DEEP_TEXT) or "").split())

    def open_until(self, url: str, shows: tuple[str, ...], timeout_s: float = 90) -> tuple[str, list[str]]:
        """Navigate to `url` and wait until its text holds every one of `shows` (single-page apps fetch after
        loading); returns the text and what it still lacks when `timeout_s` ran out."""
        self.call("Page.navigate", url=url)
        return self.wait_for(shows, timeout_s)

    def wait_for(self, shows: tuple[str, ...], timeout_s: float = 90) -> tuple[str, list[str]]:
        """Wait until the page's text holds every one of `shows`; the text and what it still lacks at the end."""
        deadline = time.monotonic() + timeout_s
        while True:
            text = self.text()
            missing = [wanted for wanted in shows if wanted not in text]
            if not missing or time.monotonic() > deadline:
                return text, missing
            time.sleep(1)

    def click(self, label: str) -> bool:
        """Click the first button whose label (aria-label or text) is `label`; whether there was one."""
        script = (
            "(() => { const button = [...document.querySelectorAll('button')].find((b) => "
            f"b.getAttribute('aria-label') === {json.dumps(label)} || b.innerText.trim() === {json.dumps(label)});"
            " if (button) button.click(); return Boolean(button); })()"
        )
        return bool(self.evaluate(script))

    def screenshot(self, target: Path) -> None:
        target.write_bytes(base64.b64decode(self.call("Page.captureScreenshot")["data"]))


@contextmanager
def chromium_page(profile: Path, size: str = "1600,1000") -> Iterator[Page]:
    """A headless Chromium with one tab (its profile in `profile`), stopped afterwards."""
    if CHROMIUM is None:
        raise RuntimeError(NO_CHROMIUM)
    port = closed_port()
    flags = ["--headless", "--no-sandbox", "--disable-gpu", f"--window-size={size}", "--hide-scrollbars"]
    browser = subprocess.Popen(
        [CHROMIUM, *flags, f"--remote-debugging-port={port}", f"--user-data-dir={profile}", "about:blank"],
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
            if time.monotonic() > deadline:
                raise RuntimeError("Chromium's DevTools did not answer within 60 s")
            time.sleep(0.3)
        # No Origin header, as a DevTools client that is not a web page: Chromium refuses a websocket whose Origin it
        # was not started to allow (--remote-allow-origins), and websocket-client sends one by default.
        socket = websocket.create_connection(pages[0]["webSocketDebuggerUrl"], timeout=60, suppress_origin=True)
        try:
            yield Page(socket)
        finally:
            socket.close()
    finally:
        browser.terminate()
        browser.wait(timeout=30)
