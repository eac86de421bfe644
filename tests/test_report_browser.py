"""The report as a person sees it: headless Chromium loads the page, every image decodes and
is non-blank, nothing fails to load and no error is logged.

Needs a Chromium binary on PATH (Debian package ``chromium``; ``.ci/run`` installs it). The
test skips, saying so, only where none is installed.
"""
from __future__ import annotations

import base64
import html
import io
import json
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from kvsim.cli import run

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "traces" / "demo_mixture.jsonl"
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")
FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--hide-scrollbars",
         "--disable-extensions", "--mute-audio"]

# Appended to a copy of the page: records load errors, blocked resources (the page's CSP
# forbids anything not embedded) and every image's decoded size, then writes them into the
# DOM for --dump-dom. The CSP is widened only to let this one inline script run.
PROBE = """
<script>
window.__errors = [];
window.addEventListener('error', e => window.__errors.push(String(e.message || (e.target && e.target.src) || e)), true);
document.addEventListener('securitypolicyviolation', e => window.__errors.push('blocked: ' + e.blockedURI));
window.addEventListener('load', () => {
  const imgs = Array.from(document.images).map(i => ({alt: i.alt, w: i.naturalWidth, h: i.naturalHeight,
                                                      complete: i.complete}));
  const out = document.createElement('pre');
  out.id = 'kvsim-probe';
  out.textContent = JSON.stringify({errors: window.__errors, images: imgs,
                                    height: document.documentElement.scrollHeight});
  document.body.appendChild(out);
});
</script>
"""


def _browser() -> str:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("no Chromium on PATH (looked for " + ", ".join(BROWSERS) + "); install the Debian package "
                "'chromium' to run the browser check of the HTML report")


def _chromium(browser: str, tmp: Path, *args: str) -> subprocess.CompletedProcess:
    profile = tmp / "profile"
    profile.mkdir(exist_ok=True)
    return subprocess.run([browser, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True, text=True,
                          timeout=120)


def _pixels(png: bytes) -> np.ndarray:
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(png)).convert("RGB"), dtype=np.float64)


def _non_blank(png: bytes) -> bool:
    """More than one colour, with real spread (not a flat or nearly flat image)."""
    px = _pixels(png)
    return px.std() > 5.0 and len(np.unique(px.reshape(-1, 3), axis=0)) > 20


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("browser") / "report.html"
    # 120 requests keep the concurrent replays of the "Under load" section short
    assert run(["report", str(DEMO), "-o", str(out), "--capacity", "20000", "--limit", "120"]) == 0
    return out


def test_report_loads_in_chromium_with_every_image_decoded(demo_report: Path, tmp_path: Path) -> None:
    """Chromium loads the page without errors or blocked resources; every image has pixels."""
    browser = _browser()
    page = demo_report.read_text(encoding="utf-8")
    embedded = re.findall(r'<img src="data:image/png;base64,([^"]+)"', page)
    assert len(embedded) >= 6, "expected one embedded PNG per chart"
    assert not re.search(r'(src|href)="(https?:)?//', page), "the page must not reference the network"
    probe = page.replace("default-src 'none';", "default-src 'none'; script-src 'unsafe-inline';", 1)
    probe = probe.replace("</body>", PROBE + "</body>")
    copy = tmp_path / "probe.html"
    copy.write_text(probe, encoding="utf-8")
    done = _chromium(browser, tmp_path, "--virtual-time-budget=5000", "--dump-dom", copy.as_uri())
    m = re.search(r'<pre id="kvsim-probe">(.*?)</pre>', done.stdout, re.S)
    assert m, f"the page did not finish loading in Chromium (rc {done.returncode}): {done.stderr[-2000:]}"
    state = json.loads(html.unescape(m.group(1)))
    assert state["errors"] == [], f"errors while loading the report: {state['errors']}"
    assert len(state["images"]) == len(embedded)
    for img in state["images"]:
        assert img["complete"] and img["w"] > 100 and img["h"] > 100, f"image not decoded: {img}"
    alts = " ".join(img["alt"] for img in state["images"])
    assert "time to first token, with and without prefix caching" in alts     # the Under load section
    assert "sequential and concurrent replay" in alts
    assert "Under load: concurrent replay" in done.stdout
    for b64 in embedded:
        assert _non_blank(base64.b64decode(b64)), "an embedded chart is blank"
    assert "Uncaught" not in done.stderr


def test_report_screenshot_is_not_blank(demo_report: Path, tmp_path: Path) -> None:
    """A screenshot of the top of the page (key numbers and the first chart) shows content."""
    browser = _browser()
    shot = tmp_path / "shot.png"
    done = _chromium(browser, tmp_path, "--window-size=1100,1800", f"--screenshot={shot}", demo_report.as_uri())
    assert shot.exists(), f"no screenshot (rc {done.returncode}): {done.stderr[-2000:]}"
    px = _pixels(shot.read_bytes())
    assert px.shape[0] >= 1000 and px.shape[1] >= 1000
    assert _non_blank(shot.read_bytes())
    # the first chart sits below the key numbers: the lower half is not empty either
    lower = px[px.shape[0] // 2:]
    assert lower.std() > 5.0
