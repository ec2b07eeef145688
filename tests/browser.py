"""A page opened as a person would: headless Chromium (Debian's ``chromium``) driven over the DevTools protocol on
a pipe (``--remote-debugging-pipe``: JSON messages ended by a NUL byte, fd 3 in, fd 4 out), no library needed.
``visit`` loads a file and reports its console errors, uncaught exceptions, every request it made, the text of
an element and a screenshot."""

from __future__ import annotations

import base64
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path


def chromium() -> str | None:
    return next((p for p in map(shutil.which, ("chromium", "chromium-browser", "google-chrome")) if p), None)


class Browser:
    def __init__(self, exe: str):
        self.profile = tempfile.mkdtemp(prefix="mtpbench-chromium-")
        to_child, self._w = os.pipe()
        self._r, from_child = os.pipe()

        def fds() -> None:  # the child reads commands on fd 3 and writes answers on fd 4
            a, b = os.dup(to_child), os.dup(from_child)  # copies first: either end may already be fd 3 or 4
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)  # dup2 onto itself keeps close-on-exec (os.pipe's ends have it)
            os.set_inheritable(4, True)

        self.proc = subprocess.Popen(
            [exe, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", "--hide-scrollbars", f"--user-data-dir={self.profile}",
             "about:blank"],
            preexec_fn=fds, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_child)
        os.close(from_child)
        self._next, self._buf, self.events = 0, b"", []

    def _read(self, timeout: float) -> dict | None:
        end = time.monotonic() + timeout
        while b"\0" not in self._buf:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self._r], [], [], left)[0]:
                return None
            chunk = os.read(self._r, 1 << 20)
            if not chunk:
                raise RuntimeError("chromium closed its DevTools pipe")
            self._buf += chunk
        msg, _, self._buf = self._buf.partition(b"\0")
        return json.loads(msg)

    def send(self, method: str, params: dict | None = None, session: str | None = None, timeout: float = 60) -> dict:
        self._next += 1
        msg = {"id": self._next, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self._w, json.dumps(msg).encode() + b"\0")
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            got = self._read(end - time.monotonic())
            if got is None:
                break
            if got.get("id") == self._next:
                if "error" in got:
                    raise RuntimeError(f"{method}: {got['error']}")
                return got.get("result", {})
            self.events.append(got)
        raise TimeoutError(f"chromium did not answer {method} within {timeout} s")

    def wait_for(self, method: str, timeout: float = 60) -> dict:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if any(e.get("method") == method for e in self.events):
                return next(e for e in self.events if e.get("method") == method)
            got = self._read(end - time.monotonic())
            if got is not None:
                self.events.append(got)
        raise TimeoutError(f"no {method} within {timeout} s")

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=10)
        except Exception:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._w)
        os.close(self._r)
        shutil.rmtree(self.profile, ignore_errors=True)


def visit(exe: str, page: Path, screenshot: Path, selector: str = "#answer", width: int = 1280,
          height: int = 1600, probe: str | None = None) -> dict:
    """Open ``page`` and return {"console_errors", "exceptions", "requests", "text", "height", "probe"}; the
    screenshot of the top ``height`` pixels is written to ``screenshot``; ``probe``: a JavaScript expression
    evaluated on the page (its JSON-able value under "probe")."""
    b = Browser(exe)
    try:
        target = b.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        s = b.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for domain in ("Runtime", "Log", "Network", "Page"):
            b.send(f"{domain}.enable", session=s)
        b.send("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                      "mobile": False}, session=s)
        b.events.clear()
        b.send("Page.navigate", {"url": Path(page).resolve().as_uri()}, session=s)
        b.wait_for("Page.loadEventFired")
        time.sleep(0.3)  # late console messages
        text = b.send("Runtime.evaluate", {"expression": f"(document.querySelector({json.dumps(selector)})||{{}})"
                                                         ".innerText||''", "returnByValue": True}, session=s)
        full = b.send("Runtime.evaluate", {"expression": "document.documentElement.scrollHeight",
                                           "returnByValue": True}, session=s)
        probed = b.send("Runtime.evaluate", {"expression": probe, "returnByValue": True}, session=s) if probe else {}
        shot = b.send("Page.captureScreenshot", {"format": "png"}, session=s)
        Path(screenshot).write_bytes(base64.b64decode(shot["data"]))
        ev = b.events
        console = [e["params"] for e in ev if e.get("method") == "Runtime.consoleAPICalled"
                   and e["params"].get("type") in ("error", "assert")]
        console += [e["params"]["entry"] for e in ev if e.get("method") == "Log.entryAdded"
                    and e["params"]["entry"].get("level") == "error"]
        return {"console_errors": console,
                "exceptions": [e["params"] for e in ev if e.get("method") == "Runtime.exceptionThrown"],
                "requests": [e["params"]["request"]["url"] for e in ev if e.get("method") == "Network.requestWillBeSent"],
                "text": text.get("result", {}).get("value", ""), "height": full.get("result", {}).get("value"),
                "probe": probed.get("result", {}).get("value")}
    finally:
        b.close()
