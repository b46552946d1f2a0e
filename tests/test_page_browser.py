"""The published page in a real headless Chromium: it loads from file:// without any network
request, has one row per trial, sorts on a header click, and its plots render.

Chromium is driven over the DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages,
NUL-terminated, commands on fd 3 and replies on fd 4), so no websocket client or webdriver is
needed. A screenshot is kept in tests/artifacts/ (git-ignored) to look at.
"""

from __future__ import annotations

import base64
import fcntl
import itertools
import json
import os
import select
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from synthetic_studies import synthetic_trials, write_study

from benchmark.leaderboard import Settings, build_board, publish, read_results

ARTIFACTS = Path(__file__).parent / "artifacts"
BROWSER = os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser")
FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--remote-debugging-pipe",
]

pytestmark = pytest.mark.skipif(
    BROWSER is None, reason="chromium not installed (apt-get install -y chromium chromium-driver)"
)


class Chromium:
    """A headless Chromium and one page of it, spoken to over the DevTools pipe."""

    def __init__(self, profile: Path):
        to_browser, self._to_browser = os.pipe()
        self._from_browser, from_browser = os.pipe()
        # Chromium expects the pipe on fds 3 (its input) and 4 (its output); bash moves them there
        # (dash takes one-digit fds only). The child's ends are lifted above 9 first, so that one
        # redirection cannot clobber the source of the other.
        to_browser, from_browser = (_above(fd, 10) for fd in (to_browser, from_browser))
        script = f'exec "$0" "$@" 3<&{to_browser} 4>&{from_browser}'
        self.proc = subprocess.Popen(
            ["bash", "-c", script, BROWSER, *FLAGS, f"--user-data-dir={profile}"],
            pass_fds=(to_browser, from_browser),
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        os.close(to_browser)
        os.close(from_browser)
        self._ids = itertools.count(1)
        self._buffer = b""
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]

    def call(self, method: str, session: str | None = None, **params) -> dict:
        ident = next(self._ids)
        message = {
            "id": ident,
            "method": method,
            "params": params,
            **({"sessionId": session} if session else {}),
        }
        os.write(self._to_browser, json.dumps(message).encode() + b"\0")
        while True:
            reply = self._next()
            if reply.get("id") == ident:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply["result"]
            self.events.append(reply)

    def page(self, method: str, **params) -> dict:
        return self.call(method, session=self.session, **params)

    def evaluate(self, expression: str):
        result = self.page(
            "Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True
        )
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def wait_for(self, method: str, timeout: float = 20.0) -> dict:
        deadline = time.monotonic() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._next(deadline - time.monotonic()))
        return next(e for e in self.events if e.get("method") == method)

    def _next(self, timeout: float = 20.0) -> dict:
        while b"\0" not in self._buffer:
            ready, _, _ = select.select([self._from_browser], [], [], max(timeout, 0))
            chunk = os.read(self._from_browser, 1 << 20) if ready else b""
            if not chunk:
                raise TimeoutError(
                    "chromium sent nothing" if not ready else "chromium closed the pipe"
                )
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def close(self):
        os.close(self._to_browser)  # chromium quits when its command pipe closes
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._from_browser)


def _above(fd: int, floor: int) -> int:
    lifted = fcntl.fcntl(fd, fcntl.F_DUPFD, floor)
    os.close(fd)
    return lifted


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("results")
    trials = synthetic_trials("browser", shapes=2, seeds=2)
    write_study(root, trials)
    out = root.parent / "site"
    publish(build_board(read_results([root]), Settings()), ["html"], out=out)
    return out / "index.html", len(trials)


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    chromium = Chromium(tmp_path_factory.mktemp("profile"))
    yield chromium
    chromium.close()


@pytest.fixture(scope="module")
def loaded(browser, site):
    index, n_trials = site
    browser.page("Network.enable")
    # Any http(s)/ws request would be refused and logged as loadingFailed with a blockedReason.
    browser.page("Network.setBlockedURLs", urls=["http://*", "https://*", "ws://*", "wss://*"])
    browser.page("Page.enable")
    browser.page(
        "Emulation.setDeviceMetricsOverride",
        width=1400,
        height=2000,
        deviceScaleFactor=1,
        mobile=False,
    )
    browser.page("Page.navigate", url=index.as_uri())
    browser.wait_for("Page.loadEventFired")
    return browser, index, n_trials


def test_page_makes_no_network_request(loaded):
    browser, index, _ = loaded
    requested = [
        e["params"]["request"]["url"]
        for e in browser.events
        if e.get("method") == "Network.requestWillBeSent"
    ]
    blocked = [e["params"] for e in browser.events if e.get("method") == "Network.loadingFailed"]
    assert index.as_uri() in requested
    assert [u for u in requested if not u.startswith(("file:", "data:"))] == []
    assert blocked == []
    assert "http://" not in index.read_text() and "https://" not in index.read_text()


def test_trials_table_has_one_row_per_trial(loaded):
    browser, _, n_trials = loaded
    assert browser.evaluate("document.querySelectorAll('#trials tbody tr').length") == n_trials


def test_header_click_sorts_the_table(loaded):
    browser, _, _ = loaded
    ppl = "[...document.querySelectorAll('#trials th')].findIndex(th => th.textContent.startsWith('PPL'))"
    column = (
        f"[...document.querySelectorAll('#trials tbody tr')].map(r => r.cells[{ppl}].textContent)"
    )
    click = f"document.querySelectorAll('#trials th')[{ppl}].click()"

    def shown():  # the column as displayed: perplexity to 2 decimals, "—" for failed trials
        return [None if text == "—" else float(text) for text in browser.evaluate(column)]

    before = shown()
    numbers = sorted(v for v in before if v is not None)
    missing = [v for v in before if v is None]
    assert missing and len(set(numbers)) > 10, (
        "the fixture should hold failed trials and many finished ones"
    )
    browser.evaluate(click)
    assert shown() == numbers + missing  # ascending, empty last
    browser.evaluate(click)
    assert shown() == numbers[::-1] + missing


def test_plots_render(loaded):
    browser, _, _ = loaded
    images = browser.evaluate("""[...document.images].map(i =>
        ({alt: i.alt, done: i.complete, natural: i.naturalWidth, shown: i.getBoundingClientRect().width}))""")
    assert len(images) >= 4  # three frontier pairs and the per-family grid, at least
    for image in images:
        assert image["done"] and image["natural"] > 0 and image["shown"] > 0, image


def test_full_page_screenshot(loaded):
    browser, _, _ = loaded
    size = browser.page("Page.getLayoutMetrics")["cssContentSize"]
    clip = {"x": 0, "y": 0, "width": size["width"], "height": size["height"], "scale": 1}
    shot = browser.page(
        "Page.captureScreenshot", format="png", clip=clip, captureBeyondViewport=True
    )["data"]
    ARTIFACTS.mkdir(exist_ok=True)
    path = ARTIFACTS / "leaderboard_page.png"
    path.write_bytes(base64.b64decode(shot))
    print(f"screenshot: {path}")
    assert path.stat().st_size > 10_000  # a blank page compresses to a few hundred bytes


def test_the_ranking_comes_first_and_fits_a_laptop(loaded):
    """A reader comes for the ranking: it is the first section, and at a laptop's 1280 pixels its
    table and the page fit the window (wider tables scroll in their own box); every column is one
    click away, below it."""
    browser, _, _ = loaded
    browser.page(
        "Emulation.setDeviceMetricsOverride",
        width=1280,
        height=800,
        deviceScaleFactor=1,
        mobile=False,
    )
    try:
        sections = browser.evaluate("[...document.querySelectorAll('h2')].map(h => h.textContent)")
        assert sections[:2] == ["Leaderboard", "Frontiers"] and sections.index(
            "All trials"
        ) > sections.index("Studies")
        first = browser.evaluate("""(() => { const t = document.querySelector('table');
            return {caption: t.caption.textContent, width: t.getBoundingClientRect().width,
                    heads: [...t.tHead.rows[0].cells].map(c => c.textContent), rows: t.tBodies[0].rows.length}; })()""")
        assert (
            first["caption"] == "Budget 30M" and first["rows"] > 10 and first["width"] <= 1280 - 32
        )
        assert first["heads"] == [
            "#",
            "Family",
            "Structure",
            "Variant",
            "Params",
            "PPL",
            "Seeds",
            "Pareto",
        ]
        assert browser.evaluate("document.documentElement.scrollWidth") <= 1280
        full = browser.evaluate("""(() => { const d = document.querySelector('details');
            d.open = true; const t = d.querySelector('table');
            return {summary: d.querySelector('summary').textContent, heads: t.tHead.rows[0].cells.length,
                    shown: t.getBoundingClientRect().height > 0}; })()""")
        assert (
            full["summary"] == f"All {full['heads']} columns"
            and full["heads"] > 12
            and full["shown"]
        )
    finally:
        browser.page(
            "Emulation.setDeviceMetricsOverride",
            width=1400,
            height=2000,
            deviceScaleFactor=1,
            mobile=False,
        )
