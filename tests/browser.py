"""A small headless Chromium driver for the page tests and `benchmarks/bench_pages.py`, standard library only.

Chromium is started with `--remote-debugging-pipe`: the Chrome DevTools protocol then runs over two pipes
(the browser reads commands on fd 3 and writes answers and events on fd 4, each message a JSON object ended
by a NUL byte), so no websocket client and no open port are needed.

    with Browser() as browser:
        page = browser.open(path_or_url)
        page.evaluate("document.title")
        page.screenshot(tmp_path / "page.png")
        page.errors                      # console errors, uncaught exceptions, failed loads

`find_chromium()` returns the binary or None (the tests skip then, naming Debian's `chromium` package).
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import select
import shutil
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
SKIP_REASON = "headless Chromium not found: install Debian's `chromium` package (apt-get install -y chromium)"


def find_chromium() -> str | None:
    """The path of a Chromium binary ($CHROMIUM, else the first of `CHROMIUM_NAMES` on PATH), or None."""
    explicit = os.environ.get("CHROMIUM")
    if explicit and Path(explicit).is_file():
        return explicit
    for name in CHROMIUM_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


class BrowserError(RuntimeError):
    """The browser failed, exited, or did not answer in time."""


class Browser:
    """One headless Chromium process driven over the DevTools pipe; a context manager that ends it."""

    def __init__(
        self, binary: str | None = None, timeout_s: float = 30.0, width: int = 1280, height: int = 900
    ):
        binary = binary or find_chromium()
        if binary is None:
            raise BrowserError(SKIP_REASON)
        self.timeout_s = timeout_s
        self._profile = tempfile.mkdtemp(prefix="lerobot-chromium-")
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()
        args = [
            binary,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--mute-audio",
            "--no-first-run",
            "--no-default-browser-check",
            "--disable-extensions",
            "--disable-background-networking",
            "--autoplay-policy=no-user-gesture-required",
            "--allow-file-access-from-files",
            f"--window-size={width},{height}",
            f"--user-data-dir={self._profile}",
            "--remote-debugging-pipe",
            "about:blank",
        ]

        def child_fds() -> None:  # the protocol's fixed descriptors in the browser
            # Copies first: the pipe's own numbers may be 3 or 4. `dup2` makes 3 and 4 inheritable; every
            # other descriptor of this process is not (Python's default), so exec closes it.
            read_copy, write_copy = os.dup(to_browser_r), os.dup(from_browser_w)
            os.dup2(read_copy, 3)
            os.dup2(write_copy, 4)

        self._log = open(Path(self._profile) / "stderr.log", "wb")  # noqa: SIM115 (closed in `close`)
        self.process = subprocess.Popen(
            args,
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
            close_fds=False,
            preexec_fn=child_fds,
        )
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict[str, Any]] = []

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """End the browser (politely, then by force) and remove its profile directory."""
        if self.process.poll() is None:
            with contextlib.suppress(BrowserError):
                self.send("Browser.close", timeout_s=5)
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        for fd in (self._to_browser, self._from_browser):
            with contextlib.suppress(OSError):
                os.close(fd)
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("the browser did not answer in time")
            ready, _, _ = select.select([self._from_browser], [], [], left)
            if ready:
                chunk = os.read(self._from_browser, 1 << 20)
                if not chunk:
                    raise BrowserError(f"the browser exited (code {self.process.poll()})")
                self._buffer += chunk
        raw, _, self._buffer = self._buffer.partition(b"\0")
        return json.loads(raw)

    def send(
        self,
        method: str,
        params: dict[str, Any] | None = None,
        session: str | None = None,
        timeout_s: float | None = None,
    ) -> dict[str, Any]:
        """Send one protocol command and return its result; events that arrive meanwhile go to `events`."""
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + (timeout_s or self.timeout_s)
        while True:
            answer = self._read_message(deadline)
            if answer.get("id") == self._next_id:
                if "error" in answer:
                    raise BrowserError(f"{method}: {answer['error']}")
                return answer.get("result", {})
            self.events.append(answer)

    def pump(self, seconds: float) -> None:
        """Collect the events that arrive within `seconds`."""
        deadline = time.monotonic() + seconds
        try:
            while True:
                self.events.append(self._read_message(deadline))
        except BrowserError:
            if self.process.poll() is not None:
                raise

    def open(self, target: str | Path, wait_s: float | None = None) -> Page:
        """A new tab showing `target` (a file path, with an optional `#fragment`, or a URL), once its load
        event has fired."""
        url = str(target)
        if not url.startswith(("file:", "http:", "about:")):
            path, hash_mark, fragment = url.partition("#")
            url = Path(path).resolve().as_uri() + hash_mark + fragment
        target_id = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target_id, "flatten": True})["sessionId"]
        page = Page(self, session)
        for domain in ("Page", "Runtime", "Log"):
            self.send(f"{domain}.enable", session=session)
        self.send("Page.navigate", {"url": url}, session=session)
        page.wait_for_event("Page.loadEventFired", wait_s or self.timeout_s)
        return page


class Page:
    """One tab of a `Browser` (a flat protocol session)."""

    def __init__(self, browser: Browser, session: str):
        self.browser, self.session = browser, session

    def _mine(self) -> list[dict[str, Any]]:
        return [e for e in self.browser.events if e.get("sessionId") == self.session]

    def wait_for_event(self, method: str, timeout_s: float) -> dict[str, Any]:
        """The first event `method` of this tab (waiting up to `timeout_s` for it)."""
        deadline = time.monotonic() + timeout_s
        while True:
            for event in self._mine():
                if event.get("method") == method:
                    return event
            if time.monotonic() > deadline:
                raise BrowserError(f"no {method} within {timeout_s} s")
            self.browser.pump(0.05)

    def evaluate(self, expression: str, timeout_s: float | None = None) -> Any:
        """The value of the JavaScript `expression` (a promise is awaited); a thrown error is a BrowserError."""
        result = self.browser.send(
            "Runtime.evaluate",
            {"expression": expression, "awaitPromise": True, "returnByValue": True},
            session=self.session,
            timeout_s=timeout_s,
        )
        if "exceptionDetails" in result:
            details = result["exceptionDetails"]
            raise BrowserError(
                f"{expression[:60]}...: {details.get('exception', {}).get('description', details)}"
            )
        return result["result"].get("value")

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the whole page at `path`; return it."""
        data = self.browser.send(
            "Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True}, session=self.session
        )["data"]
        path = Path(path)
        path.write_bytes(base64.b64decode(data))
        return path

    @property
    def errors(self) -> list[str]:
        """Console errors, uncaught exceptions and failed resource loads of this tab so far."""
        found = []
        for event in self._mine():
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(
                    " ".join(str(a.get("value", a.get("description", ""))) for a in params.get("args", []))
                )
            elif method == "Runtime.exceptionThrown":
                details = params.get("exceptionDetails", {})
                found.append(
                    details.get("exception", {}).get("description") or details.get("text", "exception")
                )
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                entry = params["entry"]
                found.append(f"{entry.get('text')} ({entry.get('url', '')})")
        return found
