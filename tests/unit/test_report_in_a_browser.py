"""``report.html`` as a person sees it: opened in headless Chromium (Debian's ``chromium`` package), the page renders
(a screenshot), every plot it shows is there, and the browser logs no console error. Skips where Chromium is missing:
it is an apt package, not a pip one, so a clean clone's CI may not have it."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hf_distprof.cli.main import main

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden" / "cpu_slow_data"


def _browser() -> str | None:
    return next((shutil.which(b) for b in ("chromium", "chromium-browser", "google-chrome") if shutil.which(b)), None)


@pytest.mark.skipif(_browser() is None, reason="no Chromium here (apt-get install chromium)")
def test_the_report_opens_with_the_box_every_plot_and_no_console_error(tmp_path: Path) -> None:
    report = tmp_path / "report"
    assert main(["analyze", str(GOLDEN), "--report", str(report)]) == 0
    html = (report / "report.html").read_text()
    images = re.findall(r'<img[^>]+src="([^"]{0,40})', html)  # the plots travel inside the page
    assert len(images) >= 5 and all(src.startswith("data:image/png;base64,") for src in images), images
    shot = tmp_path / "shot.png"
    page = (report / "report.html").as_uri()
    proc = subprocess.run([str(_browser()), "--headless", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", "--window-size=1000,1400", f"--screenshot={shot}", page],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert shot.stat().st_size > 50_000  # a rendered page, not a blank one
    console = [line for line in proc.stderr.splitlines() if "CONSOLE" in line]
    assert console == []
    dom = subprocess.run([str(_browser()), "--headless", "--no-sandbox", "--disable-gpu", "--dump-dom",
                          (report / "report.html").as_uri()], capture_output=True, text=True, timeout=120).stdout
    assert "hf-distprof: in short" in dom and "Rank 1 holds the others back: its data loading" in dom
