"""Real headless Chromium (Debian ``chromium``), driven over the DevTools protocol.

No WebDriver dependency: Chromium is started with ``--remote-debugging-port=0``
and a new empty profile; :class:`Browser` talks CDP over the ``websockets``
client Airflow already installs. Used to load a page as a person's browser
would (cookies, JavaScript, fetch), read its rendered text and save a screenshot.
"""

from __future__ import annotations

import base64
import contextlib
import itertools
import json
import pathlib
import shutil
import subprocess
import tempfile
import time
import urllib.request
from typing import Any

FLAGS = [
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
    "--disable-background-networking", "--disable-component-update", "--disable-sync",
    "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1", "--window-size=1400,900",
]


def chromium_path() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    def __init__(self) -> None:
        exe = chromium_path()
        if exe is None:
            raise RuntimeError("chromium is not installed: apt-get install -y chromium chromium-driver")
        self.profile = tempfile.mkdtemp(prefix="nexus-chromium-")
        self.proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={self.profile}", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        port_file = pathlib.Path(self.profile) / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not port_file.exists() or not port_file.read_text().strip():
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError("chromium did not open its DevTools port")
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as resp:
            pages = [t for t in json.loads(resp.read()) if t["type"] == "page"]
        from websockets.sync.client import connect

        self._exit = contextlib.ExitStack()
        self.ws = self._exit.enter_context(
            connect(pages[0]["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024, open_timeout=10))
        self._ids = itertools.count(1)
        self.send("Page.enable")
        self.send("Network.enable")

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        msg_id = next(self._ids)
        self.ws.send(json.dumps({"id": msg_id, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv(timeout=60))
            if msg.get("id") == msg_id:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})

    def set_cookie(self, url: str, name: str, value: str) -> None:
        self.send("Network.setCookie", name=name, value=value, url=url, path="/")

    def goto(self, url: str) -> None:
        self.send("Page.navigate", url=url)
        self.wait_for("document.readyState === 'complete'")

    def eval(self, expression: str) -> Any:
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        return result.get("result", {}).get("value")

    def wait_for(self, expression: str, timeout_s: float = 30.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.eval(expression)
            if value:
                return value
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never satisfied: {expression}")
            time.sleep(0.25)

    def screenshot(self, path: pathlib.Path) -> pathlib.Path:
        data = self.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._exit.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
