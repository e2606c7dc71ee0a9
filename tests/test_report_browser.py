"""The report in a real browser: headless Chromium driven over the DevTools protocol.

Chromium is started with `--remote-debugging-pipe` (the protocol as NUL-separated JSON on file
descriptors 3 and 4; no websocket, no port, no extra package). The test loads the report of
the fixture from a `file://` URL and checks that every figure rendered (a `.js-plotly-plot`
with its `svg.main-svg` per figure; the page's own `data-rendered` marker), that no JavaScript
error or console error was logged, that no request other than file:/data:/blob: was made, and
that clicking a table header sorts the table.

Needs the Debian package `chromium`; skipped when it is absent, except under CI (CI=...),
where it must run.
"""

from __future__ import annotations

import fcntl
import json
import os
import queue
import shutil
import subprocess
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from cpbench.app.report import build_comparison, build_report, write_report
from cpbench.render.html.comparison import render_comparison
from cpbench.render.html.report import render_report

FIXTURES = Path(__file__).parent / "fixtures"
CHROMIUM_NAMES = ("chromium", "chromium-browser", "google-chrome", "chrome")
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-dev-shm-usage",
    "--hide-scrollbars",
    "--window-size=1400,2200",
)
LOCAL_SCHEMES = ("file:", "data:", "blob:", "about:")
HOSTILE = "<script>alert(1)</script>"
HOSTILE_IMG = "<img src=x onerror=alert(2)>"
HOSTILE_ERROR = "<script>alert(3)</script>"


def find_chromium() -> str | None:
    for name in CHROMIUM_NAMES:
        path = shutil.which(name)
        if path:
            return path
    return None


class Chromium:
    """Headless Chromium and a minimal DevTools-protocol client over `--remote-debugging-pipe`."""

    def __init__(self, binary: str, timeout: float = 60.0) -> None:
        self.timeout = timeout
        self.events: list[dict[str, Any]] = []
        self._replies: queue.Queue[dict[str, Any]] = queue.Queue()
        self._next_id = 0
        self.profile_dir = tempfile.mkdtemp(prefix="cpbench-chromium-")
        to_child_r, to_child_w = os.pipe()
        from_child_r, from_child_w = os.pipe()
        # Keep the child's ends away from 3 and 4 so the dup2 calls below cannot clobber them.
        high_r = fcntl.fcntl(to_child_r, fcntl.F_DUPFD_CLOEXEC, 10)
        high_w = fcntl.fcntl(from_child_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.close(to_child_r)
        os.close(from_child_w)

        def child_fds() -> None:
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)

        self.proc = subprocess.Popen(
            [
                binary,
                *CHROMIUM_FLAGS,
                f"--user-data-dir={self.profile_dir}",
                "--remote-debugging-pipe",
                "about:blank",
            ],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(3, 4),
            preexec_fn=child_fds,  # noqa: PLW1509 - single-threaded at this point
        )
        os.close(high_r)
        os.close(high_w)
        self._out = os.fdopen(to_child_w, "wb", buffering=0)
        self._in = os.fdopen(from_child_r, "rb", buffering=0)
        self._reader = threading.Thread(target=self._read_loop, daemon=True)
        self._reader.start()

    def _read_loop(self) -> None:
        buffer = b""
        while True:
            chunk = self._in.read(65536)
            if not chunk:
                self._replies.put({"id": -1, "closed": True})
                return
            buffer += chunk
            while b"\0" in buffer:
                message, buffer = buffer.split(b"\0", 1)
                data = json.loads(message)
                if "id" in data:
                    self._replies.put(data)
                else:
                    self.events.append(data)

    def call(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        self._out.write(json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._replies.get(timeout=max(0.1, deadline - time.monotonic()))
            if reply.get("closed"):
                raise RuntimeError("chromium closed the DevTools pipe")
            if reply["id"] == self._next_id:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def open_page(self, url: str) -> str:
        """A new tab with every relevant domain enabled, navigated to `url`; its session id."""
        target = self.call("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.call("Target.attachToTarget", {"targetId": target, "flatten": True})[
            "sessionId"
        ]
        for domain in ("Network", "Runtime", "Log", "Page"):
            self.call(f"{domain}.enable", session=session)
        self.call("Page.navigate", {"url": url}, session)
        return session

    def evaluate(self, session: str, expression: str) -> Any:
        result = self.call(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session,
        )
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, session: str, expression: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = self.evaluate(session, expression)
            if value:
                return value
            time.sleep(0.05)
        raise TimeoutError(f"{expression!r} stayed falsy for {timeout} s")

    def screenshot(self, session: str, path: Path, clip: dict | None = None) -> None:
        import base64  # noqa: PLC0415

        params: dict[str, Any] = {"format": "png", "captureBeyondViewport": True}
        if clip:
            params["clip"] = {**clip, "scale": 1}
        data = self.call("Page.captureScreenshot", params, session)["data"]
        path.write_bytes(base64.b64decode(data))

    def errors(self, since: int = 0) -> list[str]:
        """Console errors, uncaught exceptions and browser log errors (events from `since` on)."""
        found = []
        for event in self.events[since:]:
            method, params = event.get("method"), event.get("params", {})
            if method == "Runtime.exceptionThrown":
                found.append(json.dumps(params.get("exceptionDetails", {}))[:500])
            elif method == "Runtime.consoleAPICalled" and params.get("type") in ("error", "assert"):
                found.append(json.dumps(params.get("args", []))[:500])
            elif method == "Log.entryAdded" and params.get("entry", {}).get("level") == "error":
                found.append(params["entry"].get("text", "")[:500])
        return found

    def requests(self, since: int = 0) -> list[str]:
        """URLs of every request the pages made (events from `since` on)."""
        return [
            e["params"]["request"]["url"]
            for e in self.events[since:]
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except (RuntimeError, queue.Empty, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(timeout=10)
        for f in (self._out, self._in):
            try:
                f.close()
            except OSError:
                pass
        shutil.rmtree(self.profile_dir, ignore_errors=True)


@pytest.fixture(scope="module")
def browser():
    binary = find_chromium()
    if binary is None:
        if os.environ.get("CI"):
            pytest.fail("CI is set but chromium is not installed (apt-get install chromium)")
        pytest.skip("chromium is not installed (Debian: apt-get install chromium); CI runs this")
    chrome = Chromium(binary)
    try:
        yield chrome
    finally:
        chrome.close()


RENDER_STATE = """(() => {
  const plots = Array.from(document.querySelectorAll('.js-plotly-plot'));
  return {
    expected: Number(document.body.dataset.figures),
    rendered: document.body.dataset.rendered,
    errors: document.body.dataset.errors,
    plots: plots.length,
    plotsWithSvg: plots.filter(p => p.querySelector('svg.main-svg')).length,
    emptyPlots: plots.filter(p => p.querySelectorAll('.trace, .heatmaplayer image, .hm').length === 0).length,
    title: document.title,
  };
})()"""


def _check_page(chrome: Chromium, path: Path, figures: int) -> tuple[str, dict]:
    before_events = len(chrome.events)
    session = chrome.open_page(path.resolve().as_uri())
    chrome.wait_for(session, "document.body && document.body.dataset.rendered !== undefined")
    state = chrome.evaluate(session, RENDER_STATE)
    assert state["errors"] == "", state["errors"]
    assert state["expected"] == figures
    assert state["rendered"] == str(figures)
    assert state["plots"] == figures
    assert state["plotsWithSvg"] == figures
    assert state["emptyPlots"] == 0
    urls = chrome.requests(before_events)
    assert urls, "the page load itself should have been seen"
    remote = [u for u in urls if not u.startswith(LOCAL_SCHEMES)]
    assert remote == [], f"network requests made: {remote}"
    assert chrome.errors(before_events) == []
    return session, state


def test_report_renders_every_figure_offline_without_errors(browser: Chromium, tmp_path: Path):
    report = render_report(build_report([FIXTURES / "sweep.jsonl"], hardware=None))
    path = write_report(report.html, tmp_path / "report.html")
    assert report.figures >= 8
    session, state = _check_page(browser, path, report.figures)
    assert state["title"].startswith("cpbench report")

    # Sorting: click "median ms" twice -> ascending then descending, empty cells last.
    sort_state = """((title) => {
      const table = document.getElementById('record-table');
      const heads = Array.from(table.tHead.rows[0].cells);
      const col = heads.findIndex(h => h.textContent === title);
      heads[col].click();
      const read = () => Array.from(table.tBodies[0].rows).map(r => r.cells[col].dataset.sort);
      const asc = read();
      heads[col].click();
      return {asc, desc: read(), aria: heads[col].getAttribute('aria-sort')};
    })"""
    result = browser.evaluate(session, f"{sort_state}('median ms')")
    asc = [float(v) for v in result["asc"] if v != ""]
    desc = [float(v) for v in result["desc"] if v != ""]
    assert asc == sorted(asc) and len(asc) == 42
    assert desc == sorted(desc, reverse=True)
    assert result["asc"][-3:] == ["", "", ""] and result["desc"][-3:] == ["", "", ""]
    assert result["aria"] == "descending"


@pytest.mark.torch_free
def test_comparison_page_renders_and_hostile_strings_stay_text(browser: Chromium, tmp_path: Path):
    after = [json.loads(line) for line in (FIXTURES / "after.jsonl").read_text().splitlines()]
    for record in after:
        record["scenario"] = HOSTILE
        record["config"]["layout"] = HOSTILE_IMG
    failed = dict(after[0], id="hostile-failed", status="failed", error=HOSTILE_ERROR)
    path = tmp_path / "evil.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in [*after, failed]))
    report = render_comparison(build_comparison(FIXTURES / "sweep.jsonl", path))
    page = write_report(report.html, tmp_path / "compare.html")
    assert report.figures == 1
    session, _ = _check_page(browser, page, 1)
    seen = browser.evaluate(
        session,
        "({scenario: document.querySelector('dl.facts dd').textContent,"
        " imgs: document.querySelectorAll('img').length,"
        " scripts: document.querySelectorAll('script').length,"
        " body: document.body.innerText,"
        " bars: Array.from(document.querySelectorAll('.js-plotly-plot .ytick text'))"
        "   .map(t => t.textContent)})",
    )
    assert HOSTILE in seen["scenario"]
    assert HOSTILE_ERROR in seen["body"]
    assert seen["imgs"] == 0
    assert any(HOSTILE_IMG in label for label in seen["bars"])  # shown as text by plotly
    assert not [e for e in browser.events if e.get("method") == "Page.javascriptDialogOpening"]


@pytest.mark.torch_free
def test_the_checks_do_catch_errors_and_requests(browser: Chromium, tmp_path: Path):
    """The harness itself: a page that throws and fetches from a remote host is caught."""
    page = tmp_path / "bad.html"
    page.write_text(
        "<html><body><script>throw new Error('boom')</script>"
        "<img src='http://127.0.0.1:9/pixel.png'>"
        "<script>document.body.dataset.rendered = '0'</script></body></html>"
    )
    before = len(browser.events)
    session = browser.open_page(page.resolve().as_uri())
    browser.wait_for(session, "document.body && document.body.dataset.rendered !== undefined")
    deadline = time.monotonic() + 5
    pixel = "http://127.0.0.1:9/pixel.png"
    while time.monotonic() < deadline and pixel not in browser.requests(before):
        time.sleep(0.05)
    assert pixel in browser.requests(before)
    assert any("boom" in text for text in browser.errors(before))
