"""The pages of `lerobot.reports` without a browser: what the dataset viewer, an evaluation's report.html, a
run's index.html and the pages over several runs or evaluations hold, the hooks that write them, and the
scripts' options. `tests/test_browser_pages.py` opens the same pages in headless Chromium.

The builders here (`make_dataset`, `make_eval_dir`, `make_run_dir`) are shared with the browser tests."""

from __future__ import annotations

import importlib.util
import json
import logging
import re
import sys
from pathlib import Path
from typing import Any

import av
import numpy as np
import pytest
from omegaconf import OmegaConf
from test_dataset import ZARR, write_fake_zarr

from lerobot.datasets.lerobot_export import encode_video, export_lerobot_dataset
from lerobot.datasets.pusht_import import convert_pusht_zarr
from lerobot.evaluation import remove_evaluation
from lerobot.reports import try_write_eval_report, try_write_run_index, write_eval_report, write_run_index
from lerobot.reports.dataset_viewer import H264Encoding, write_dataset_viewer
from lerobot.reports.runs_page import write_evals_page, write_runs_page
from lerobot.training.metrics import MetricsLogger

REPO_ROOT = Path(__file__).resolve().parents[1]
LENGTHS = [12, 20, 9]
SIZE = 16
TASKS = ["reach-v3", "push-v3", "reach-v3"]


def load_script(name: str) -> Any:
    """A script of `scripts/` as a module."""
    spec = importlib.util.spec_from_file_location(name, REPO_ROOT / "scripts" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def inline_json(html: str, element_id: str) -> Any:
    """The inline JSON `<script type="application/json" id=...>` of a page."""
    match = re.search(
        rf'<script type="application/json" id="{re.escape(element_id)}">(.*?)</script>', html, re.S
    )
    assert match, f"no inline JSON {element_id}"
    return json.loads(match.group(1))


def assert_offline(html: str) -> None:
    """Nothing of the page comes from a network: no remote src/href, style sheet or import."""
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", html)
    assert "<link" not in html and "@import" not in html and "url(" not in html


# ------------------------------------------------------------------------------------------------ builders


def make_dataset(base: Path) -> dict[str, Path]:
    """A tiny PushT zarr (3 episodes, 16x16 camera; episode 0 reaches the goal), its conversion, and its
    LeRobotDataset v3.0 export with a task per episode and names for the state's dimensions."""
    zarr_dir = base / "zarr"
    write_fake_zarr(zarr_dir / ZARR, lengths=LENGTHS, image_size=SIZE)
    converted = convert_pusht_zarr(zarr_dir / ZARR, base / "converted" / "v1")
    v3 = export_lerobot_dataset(converted, base / "v3", task=TASKS)
    info_path = v3 / "meta" / "info.json"
    info = json.loads(info_path.read_text())
    info["features"]["observation.state"]["names"] = {"axes": ["agent_x", "agent_y"]}
    info_path.write_text(json.dumps(info))
    return {"zarr": zarr_dir, "converted": converted, "v3": v3}


def eval_info(n: int, tasks: list[str] | None = None, checkpoint: bool = True) -> dict[str, Any]:
    """An `eval_info.json` dict of `n` episodes (of each task of `tasks`), as `lerobot.evaluation` writes it."""
    from lerobot.episode_stats import aggregate_episodes

    rng = np.random.default_rng(0)
    rows = []
    for k, task in enumerate(tasks or [None]):
        for i in range(n):
            reward = float(rng.uniform(0, 1))
            row = {"episode_ix": k * n + i, "seed": 1000 + i, "sum_reward": reward * 30, "max_reward": reward}
            row.update(success=reward > 0.7, n_steps=int(rng.integers(20, 300)))
            rows.append(row if task is None else {**row, "task": task})
    info = {"per_episode": rows, "aggregated": aggregate_episodes(rows, 12.5, 5000, 6000), "video_paths": []}
    info["config"] = {
        "env": {"name": "pusht", "task": tasks},
        "policy": {"name": "diffusion"},
        "eval": {"n_episodes": n, "start_seed": 1000},
    }
    if checkpoint:
        info["checkpoint"] = {
            "path": "/runs/a/checkpoints/000004000",
            "step": 4000,
            "sha256": "ab" * 32,
            "weights": "ema",
        }
    return info


def write_mp4(path: Path, frames: int = 12, fps: int = 10) -> Path:
    """A small browser-playable mp4 (H.264, yuv420p) of moving noise."""
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(frames).integers(0, 256, (frames, 3, 32, 32), dtype=np.uint8)
    encode_video(path, [pixels], fps, H264Encoding(codec="libx264", g=fps, crf=20))
    return path


def make_eval_dir(out: Path, n: int = 6, videos: int = 2, tasks: list[str] | None = None) -> dict[str, Any]:
    """An evaluation directory: `eval_info.json` and the first `videos` episodes' mp4s; returns the info."""
    info = eval_info(n, tasks)
    out.mkdir(parents=True, exist_ok=True)
    for i in range(videos):
        write_mp4(out / "videos" / f"eval_episode_{i}.mp4")
    (out / "eval_info.json").write_text(json.dumps(info))
    return info


def make_run_dir(run: Path, steps: int = 6, eval_every: int = 3, tasks: list[str] | None = None) -> Path:
    """A training run's directory as the trainer leaves it: metrics, checkpoints with `last`, evaluations."""
    records, t = [], 1_000_000.0
    for step in range(1, steps + 1):
        t += 60.0
        records.append({"step": step, "split": "train", "time": t, "loss": 2.0 / step, "lr": 1e-4 * step})
        if step % eval_every == 0:
            t += 10.0
            agg = {k: v for k, v in eval_info(4, tasks)["aggregated"].items() if k != "per_task"}
            per_task = {f"pc_success/{task}": 25.0 * step / steps for task in tasks or []}
            records.append({"step": step, "split": "eval", "time": t, **agg, **per_task})
            info = make_eval_dir(run / "eval" / f"step_{step:09d}", n=4, videos=1, tasks=tasks)
            write_eval_report(run / "eval" / f"step_{step:09d}", info)
    run.mkdir(parents=True, exist_ok=True)
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    for step in range(eval_every, steps + 1, eval_every):
        ckpt = run / "checkpoints" / f"{step:09d}"
        ckpt.mkdir(parents=True)
        (ckpt / "model.safetensors").write_bytes(b"")
        config = {
            "env": {"name": "pusht_keypoints"},
            "policy": {"name": "diffusion"},
            "training": {"steps": steps},
        }
        (ckpt / "config.yaml").write_text(
            OmegaConf.to_yaml(OmegaConf.create({**config, "recipe_applied": None}))
        )
    (run / "checkpoints" / "last").symlink_to(f"{steps:09d}")
    return run


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> dict[str, Path]:
    return make_dataset(tmp_path_factory.mktemp("reports_data"))


# -------------------------------------------------------------------------------------------- the viewer


def test_viewer_of_the_zarr_conversion(data, tmp_path):
    index = write_dataset_viewer(data["converted"], tmp_path / "viewer", max_points=10)
    html = index.read_text()
    assert_offline(html)
    meta = inline_json(html, "index")
    assert [e["n"] for e in meta["episodes"]] == LENGTHS and meta["fps"] == 10
    assert meta["cameras"] == ["observation.image"]
    assert [e["success"] for e in meta["episodes"]] == [True, False, False]  # frames 5-6 reach the goal
    keys = [f["key"] for f in meta["features"]]
    assert {"observation.state", "action", "next.reward", "next.success"} <= set(keys)
    state = next(f for f in meta["features"] if f["key"] == "observation.state")
    assert state["names"] == ["observation.state[0]", "observation.state[1]"]  # the zarr names none
    long_one = inline_json(html, "ep-1")  # 20 frames, at most 10 points per series: the frames kept go along
    assert (
        long_one["n"] == 20 and len(long_one["t"]) == 10 and long_one["t"][0] == 0 and long_one["t"][-1] == 19
    )
    assert len(long_one["f"]["observation.environment_state"]) == 16
    assert all(len(dim) == 10 for dim in long_one["f"]["action"])
    short = inline_json(html, "ep-2")
    assert "t" not in short and len(short["f"]["action"][0]) == 9
    for episode, length in enumerate(LENGTHS):
        video = tmp_path / "viewer" / meta["episodes"][episode]["videos"]["observation.image"]
        with av.open(str(video)) as container:
            stream = container.streams.video[0]
            assert stream.codec_context.name == "h264" and stream.format.name == "yuv420p"
            assert sum(1 for _ in container.decode(stream)) == length


def test_a_viewer_stopped_midway_leaves_nothing_and_the_earlier_one_stays(data, tmp_path, monkeypatch):
    """The viewer is written into a temporary sibling and renamed into place: a stop (here an error in the
    second episode, as a Ctrl-C would) leaves no folder, and an earlier viewer there is kept whole."""
    from lerobot.reports import dataset_viewer

    out = tmp_path / "viewer"
    write_dataset_viewer(data["converted"], out, episodes=[0], max_points=10, videos=False)
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    series = dataset_viewer.episode_series
    calls = []

    def stop_at_the_second(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return series(*args, **kwargs)

    monkeypatch.setattr(dataset_viewer, "episode_series", stop_at_the_second)
    with pytest.raises(KeyboardInterrupt):
        write_dataset_viewer(data["converted"], out, max_points=10)
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before
    assert [p.name for p in tmp_path.iterdir() if p.name != "viewer"] == []


def test_viewer_of_a_lerobot_dataset_by_the_script(data, tmp_path, capsys):
    script = load_script("visualize_dataset")
    out = tmp_path / "viewer"
    cache = f"dataset.cache_dir={tmp_path / 'cache'}"
    assert (
        script.main(["--root", str(data["v3"]), "--out", str(out), "--episodes", "0,2", "--no-videos", cache])
        == 0
    )
    assert "wrote" in capsys.readouterr().out
    meta = inline_json((out / "index.html").read_text(), "index")
    assert [e["i"] for e in meta["episodes"]] == [0, 2] and meta["cameras"] == []
    assert [e["task"] for e in meta["episodes"]] == ["reach-v3", "reach-v3"]
    state = next(f for f in meta["features"] if f["key"] == "observation.state")
    assert state["names"] == ["agent_x", "agent_y"]  # from the LeRobotDataset's info.json


def test_script_errors_are_one_line(data, tmp_path, capsys, monkeypatch):
    script = load_script("visualize_dataset")
    root = str(data["converted"])
    assert script.main(["--root", root, "--episodes", "0,x", "--out", str(tmp_path / "v")]) == 2
    assert (
        capsys.readouterr().err.strip()
        == "error: --episodes 0,x: expected episode numbers and ranges, e.g. 0,5,10-19"
    )
    assert script.main(["--root", root, "--episodes", "7", "--out", str(tmp_path / "v")]) == 2
    assert "has episodes 0-2" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "rerun", None)  # rerun-sdk not installed
    assert (
        script.main(["--root", root, "--rerun", str(tmp_path / "a.rrd"), "--out", str(tmp_path / "v")]) == 2
    )
    err = capsys.readouterr().err.strip().splitlines()
    assert err == [
        'error: --rerun needs the rerun-sdk package: pip install -e ".[viz]" (or pip install rerun-sdk)'
    ]
    assert not (tmp_path / "v").exists()  # refused before any work


def test_rerun_recording(data, tmp_path):
    pytest.importorskip("rerun", reason="rerun-sdk is optional (the `viz` extra)")
    from lerobot.reports.rerun_export import write_rerun

    path = write_rerun(data["converted"], tmp_path / "ep.rrd", [1])
    assert path.stat().st_size > 20 * SIZE * SIZE * 3  # 20 frames of the camera at least


# ------------------------------------------------------------------------------------- evaluation pages


def test_eval_report_holds_figures_tasks_episodes_and_videos(tmp_path):
    out = tmp_path / "eval"
    info = make_eval_dir(out, n=5, videos=2, tasks=["reach-v3", "push</script><b>x"])
    info["tasks_not_trained_on"] = ["reach-v3"]
    html = write_eval_report(out, info).read_text()
    agg = info["aggregated"]
    assert f"{agg['pc_success']:,.1f}%" in html and f"{agg['avg_max_reward']:,.3f}" in html
    assert f"[{agg['pc_success_ci95_low']:,.1f}, {agg['pc_success_ci95_high']:,.1f}]" in html
    assert "push&lt;/script&gt;&lt;b&gt;x" in html and "push</script>" not in html  # escaped everywhere
    assert "(not trained on)" in html and "mean over tasks" in html
    assert html.count('<figure id="video-') == 2 and 'src="videos/eval_episode_1.mp4"' in html
    assert 'href="#video-0"' in html and 'href="#video-7"' not in html  # only episodes with a video link
    rows = (1 + 10) + (1 + 2 + 1) + (1 + 4)  # header and episodes; header, tasks, mean; the checkpoint's
    assert html.count("<tr>") == rows
    assert "--checkpoint /runs/a/checkpoints/000004000" in html and "eval.n_episodes=5" in html
    assert len(inline_json(html, "episode-data")) == 10


def test_a_500_episode_report_stays_small(tmp_path):
    out = tmp_path / "eval"
    make_eval_dir(out, n=500, videos=0)
    size = write_eval_report(out).stat().st_size  # read back from eval_info.json
    assert size < 5_000_000, size


def test_the_evaluation_hook_writes_the_report_and_overwrite_removes_it(tmp_path):
    from lerobot.cli import eval_main

    out = tmp_path / "eval"
    argv = [
        "policy=random",
        "env=pusht_keypoints",
        "env.max_episode_steps=5",
        "eval.n_episodes=2",
        "eval.batch_size=2",
    ]
    argv += ["eval.use_async_envs=false", "eval.max_episodes_rendered=1", "--output-dir", str(out)]
    assert eval_main(argv) == 0
    html = (out / "report.html").read_text()
    assert 'src="videos/eval_episode_0.mp4"' in html and "random on pusht_keypoints" in html
    remove_evaluation(out)
    assert not (out / "report.html").exists()


def test_a_page_that_cannot_be_written_is_a_warning(tmp_path, caplog):
    with caplog.at_level(logging.WARNING):
        assert try_write_eval_report(tmp_path / "nothing here") is None
    assert "could not write" in caplog.text and "report.html" in caplog.text


# ------------------------------------------------------------------------------------------ run pages


def test_run_index_links_evaluations_checkpoints_and_the_resume_command(tmp_path):
    run = make_run_dir(tmp_path / "run", steps=6, eval_every=3, tasks=["reach-v3", "push-v3"])
    html = write_run_index(run).read_text()
    charts = {c["id"]: c for c in inline_json(html, "run-data")["charts"]}
    assert {"chart-loss", "chart-lr", "chart-success-steps", "chart-success-hours", "chart-tasks"} <= set(
        charts
    )
    assert charts["chart-loss"]["opts"]["logy"] is True and charts["chart-loss"]["opts"]["series"][0][
        "x"
    ] == [1, 2, 3, 4, 5, 6]
    hours = charts["chart-success-hours"]["opts"]["series"][0]["x"]
    # Counted from the first record, evaluation time left out.
    assert hours == pytest.approx([120 / 3600, 300 / 3600], abs=1e-4)
    assert len(charts["chart-tasks"]["opts"]["series"]) == 2
    assert (
        'href="eval/step_000000003/report.html"' in html and 'href="eval/step_000000006/report.html"' in html
    )
    assert "checkpoints/000000006</a> <b>(last)</b>" in html
    assert f"python scripts/train.py env=pusht_keypoints policy=diffusion output_dir={run}" in html
    assert 'href="checkpoints/000000006/config.yaml"' in html
    eval_page = (run / "eval" / "step_000000003" / "report.html").read_text()
    assert 'href="../../index.html"' in eval_page  # back to the run


def test_the_metrics_hook_writes_the_index_once_there_is_a_record(tmp_path):
    cfg = OmegaConf.create({"wandb": {"enable": False}})
    logger = MetricsLogger(tmp_path / "run", cfg)
    assert try_write_run_index(tmp_path / "run") is None and not (tmp_path / "run" / "index.html").exists()
    logger.log(1, {"loss": 1.0, "lr": 1e-4})
    logger.log(1, {"pc_success": 50.0, "avg_max_reward": 0.5}, split="eval")
    assert (tmp_path / "run" / "index.html").is_file()


def test_plot_runs_and_compare_evals_write_pages(tmp_path, capsys):
    a = make_run_dir(tmp_path / "a")
    b = make_run_dir(tmp_path / "b", steps=9)
    load_script("plot_runs").main([f"{a}:first", str(b), "--html", str(tmp_path / "runs.html")])
    html = (tmp_path / "runs.html").read_text()
    charts = {c["id"]: c for c in inline_json(html, "page-data")["charts"]}
    assert [s["name"] for s in charts["chart-success-hours"]["opts"]["series"]] == ["first", "b"]
    assert 'href="a/index.html"' not in html  # no index yet: the metrics are linked
    assert 'href="a/metrics.jsonl"' in html
    base, other = tmp_path / "a" / "eval" / "step_000000003", tmp_path / "b" / "eval" / "step_000000009"
    load_script("compare_evals").main([str(base), str(other), "--html", str(tmp_path / "evals.html")])
    html = (tmp_path / "evals.html").read_text()
    assert "4 paired episodes" in html and 'href="a/eval/step_000000003/report.html"' in html
    assert "wrote" in capsys.readouterr().out
    page = write_evals_page(tmp_path / "one.html", [base / "eval_info.json"])
    assert "Paired difference" not in page.read_text()
    with pytest.raises(FileNotFoundError, match="metrics.jsonl not found"):
        write_runs_page(tmp_path / "x.html", [(tmp_path / "missing", "")])
