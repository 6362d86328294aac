"""Real browser: headless Chromium renders the fixture leaderboard without console errors."""
import json
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from harness.outputs.site import build_site
from conftest import fixture_records

FIXTURE = Path(__file__).parent / "fixtures" / "analysis" / "records.json"
CHROMIUM = next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome")
                 if shutil.which(b)), None)


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (scripts/ensure-chromium.sh installs it)")
def test_index_renders_in_headless_chromium(tmp_path):
    from PIL import Image

    index = build_site(fixture_records(FIXTURE), tmp_path / "site")
    png = tmp_path / "index.png"
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.run(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
             "--no-first-run", "--disable-background-networking", "--disable-component-update",
             "--disable-sync", f"--user-data-dir={profile}", "--enable-logging=stderr", "--v=0",
             "--window-size=1280,1600", f"--screenshot={png}", index.resolve().as_uri()],
            capture_output=True, text=True, timeout=120)
    log = proc.stdout + proc.stderr
    assert png.exists(), log[-2000:]
    console = [ln for ln in log.splitlines() if "Uncaught" in ln or "console" in ln.lower()]
    assert not console, console
    img = Image.open(png).convert("L")
    hist = img.histogram()
    non_white = sum(hist[:245])
    assert non_white > 0.02 * img.width * img.height  # text, tables and charts, not a blank page
