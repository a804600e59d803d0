"""The pages of `lerobot.reports` in headless Chromium (driven over the DevTools pipe, `tests/browser.py`):
no console error, every video loads and plays, seeking shows the frame asked for, the plots hold the series
they should, the viewer's controls work. Each test saves a screenshot under its tmp_path and prints its path.

Skipped without Chromium: install Debian's `chromium` package (`apt-get install -y chromium`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from browser import SKIP_REASON, Browser, Page, find_chromium
from test_reports import LENGTHS, inline_json, load_script, make_dataset, make_eval_dir, make_run_dir

from lerobot.datasets.episode_dataset import EpisodeDataset
from lerobot.reports.dataset_viewer import write_dataset_viewer
from lerobot.reports.eval_report import write_eval_report
from lerobot.reports.run_index import write_run_index
from lerobot.reports.runs_page import write_runs_page

pytestmark = pytest.mark.skipif(find_chromium() is None, reason=SKIP_REASON)

# Play every video for a while; report its state before and after (readyState >= 2: a frame is decoded).
PLAY_ALL = """(async () => {
  const out = [];
  for (const v of document.querySelectorAll("video")) {
    const timeout = new Promise(r => setTimeout(r, 8000));
    await Promise.race([v.play(), timeout]);
    const before = v.currentTime;
    await new Promise(r => setTimeout(r, 400));
    out.push({src: v.currentSrc, readyState: v.readyState, before, after: v.currentTime, error: v.error && v.error.code});
    v.pause();
  }
  return out;
})()"""
COUNT = """({charts: document.querySelectorAll(".chart svg").length,
             series: document.querySelectorAll("svg path.series").length,
             points: document.querySelectorAll("svg circle.point").length})"""


@pytest.fixture(scope="module")
def browser() -> Browser:
    with Browser() as b:
        yield b


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return make_dataset(tmp_path_factory.mktemp("browser_data"))


def check_videos_play(page: Page, count: int) -> None:
    videos = page.evaluate(PLAY_ALL, timeout_s=60)
    assert len(videos) == count, videos
    for v in videos:
        assert v["error"] is None and v["readyState"] >= 2 and v["after"] > v["before"], v


def finish(page: Page, path: Path) -> None:
    """Screenshot the page as a test artifact and check that it logged no error."""
    page.screenshot(path)
    print(f"screenshot: {path}")
    assert page.errors == []


def shown_frame(page: Page) -> np.ndarray:
    """The viewer's video frame on screen, (3, H, W) uint8, read back through a canvas."""
    pixels = page.evaluate(
        """(() => { const v = document.querySelector("video"), c = document.createElement("canvas");
        c.width = v.videoWidth; c.height = v.videoHeight; const g = c.getContext("2d");
        g.drawImage(v, 0, 0); return [c.width, c.height, Array.from(g.getImageData(0, 0, c.width, c.height).data)]; })()"""
    )
    width, height, rgba = pixels
    return np.asarray(rgba, dtype=np.uint8).reshape(height, width, 4)[..., :3].transpose(2, 0, 1)


def seek(page: Page, frame: int) -> dict[str, Any]:
    """Set the viewer's frame; once the video has seeked, its time and the frame label."""
    return page.evaluate(
        f"""(async () => {{ const v = document.querySelector("video");
        const done = new Promise(r => v.addEventListener("seeked", r, {{once: true}}));
        viewer.setFrame({frame}); await done;
        return {{t: v.currentTime, label: document.getElementById("frame-label").textContent}}; }})()"""
    )


def test_viewer_plays_seeks_frame_accurately_and_plots(browser, data, tmp_path):
    index = write_dataset_viewer(data["converted"], tmp_path / "viewer")
    meta = inline_json(index.read_text(), "index")
    page = browser.open(index)
    assert page.evaluate("performance.getEntriesByName('viewer-ready').length") == 1
    counts = page.evaluate(COUNT)
    assert counts["charts"] == 4  # state, environment state, action; next.* together
    assert counts["series"] == sum(len(f["names"]) for f in meta["features"])
    check_videos_play(page, 1)
    episode = EpisodeDataset(data["converted"], episodes=[1], keys=["observation.image"])
    page.evaluate("viewer.select(1)")
    truth = np.rint(episode.__getitems__(np.arange(LENGTHS[1]))["observation.image"].numpy() * 255)
    for frame in (0, 5, 13, LENGTHS[1] - 1):
        state = seek(page, frame)
        assert state["t"] == pytest.approx((frame + 0.5) / 10) and state["label"].startswith(
            f"frame {frame} /"
        )
        error = np.abs(truth - shown_frame(page).astype(np.float64)).mean(axis=(1, 2, 3))
        assert int(np.argmin(error)) == frame, error  # the frame shown is the frame asked for
    page.evaluate("document.dispatchEvent(new KeyboardEvent('keydown', {key: 'ArrowLeft'}))")
    assert page.evaluate("viewer.frame") == LENGTHS[1] - 2
    page.evaluate("document.querySelector('#episodes tbody tr[data-i=\"2\"]').click()")
    assert page.evaluate("[viewer.episode, +document.getElementById('slider').max]") == [2, LENGTHS[2] - 1]
    assert page.evaluate("location.hash") == "#ep=2"
    check_videos_play(page, 1)
    finish(page, tmp_path / "viewer.png")


def test_viewer_filters_by_task(browser, data, tmp_path):
    script = load_script("visualize_dataset")
    cache = f"dataset.cache_dir={tmp_path / 'cache'}"
    assert script.main(["--root", str(data["v3"]), "--out", str(tmp_path / "viewer"), cache]) == 0
    page = browser.open(tmp_path / "viewer" / "index.html#ep=1")
    assert page.evaluate("viewer.episode") == 1
    shown = page.evaluate(
        """(() => { const s = document.getElementById("task-filter"); s.value = "push-v3";
        s.dispatchEvent(new Event("change"));
        return [...document.querySelectorAll("#episodes tbody tr")].filter(r => r.style.display !== "none")
          .map(r => +r.dataset.i); })()"""
    )
    assert shown == [1]
    legend = page.evaluate("[...document.querySelectorAll('.legend span')].map(s => s.textContent)")
    assert "agent_x" in legend and "agent_y" in legend
    check_videos_play(page, 1)
    finish(page, tmp_path / "viewer_tasks.png")


def test_eval_report_videos_and_plot(browser, tmp_path):
    out = tmp_path / "eval"
    make_eval_dir(out, n=8, videos=3, tasks=["reach-v3", "push-v3"])
    page = browser.open(write_eval_report(out))
    check_videos_play(page, 3)
    assert page.evaluate(COUNT) == {"charts": 1, "series": 2, "points": 16}
    order = page.evaluate(
        """(() => { document.querySelectorAll("#episodes th")[4].click();
        return [...document.querySelectorAll("#episodes tbody tr")].map(r => parseFloat(r.cells[4].textContent)); })()"""
    )
    assert order == sorted(order)  # sorted by max reward
    finish(page, tmp_path / "eval.png")


def test_run_index_and_runs_page_plot_every_curve(browser, tmp_path):
    run = make_run_dir(tmp_path / "run", steps=6, eval_every=3, tasks=["reach-v3", "push-v3"])
    page = browser.open(write_run_index(run))
    charts = inline_json((run / "index.html").read_text(), "run-data")["charts"]
    counts = page.evaluate(COUNT)
    assert counts["charts"] == len(charts) and counts["series"] == sum(
        len(c["opts"]["series"]) for c in charts
    )
    finish(page, tmp_path / "run.png")
    other = make_run_dir(tmp_path / "other", steps=9, eval_every=3)
    page = browser.open(write_runs_page(tmp_path / "runs.html", [(run, "a"), (other, "b")]))
    assert page.evaluate(COUNT)["series"] == 5 * 2  # success and reward against hours and steps, loss: 2 runs
    link = page.evaluate("document.querySelector('#runs a').getAttribute('href')")
    assert link == "run/index.html"  # the run's own page, written above
    finish(page, tmp_path / "runs.png")
