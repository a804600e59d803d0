"""An evaluation's page: `report.html` beside its `eval_info.json` and `videos/`.

`write_eval_report(out_dir, info)` writes it from the dict `lerobot.evaluation.evaluate` returns (or, without
`info`, from `out_dir/eval_info.json`): the overall figures with their 95% intervals, the per-task table with
bars (multi-task envs), the max reward of every episode, the rendered episodes labelled success or failure,
the per-episode table (task, seed, success, rewards, steps; an episode with a video links to it), the
checkpoint evaluated, the command that repeats the evaluation and the config it ran. `evaluate` calls
`try_write_eval_report`, which logs a warning instead of failing the evaluation.
"""

from __future__ import annotations

import json
import logging
import re
import shlex
from pathlib import Path
from typing import Any

from omegaconf import OmegaConf

from lerobot.constants import EVAL_INFO_FILE
from lerobot.reports.html import (
    card,
    chart_div,
    esc,
    fmt,
    interval,
    json_script,
    page,
    percent_bar,
    rel,
    table,
    write_page,
)

log = logging.getLogger(__name__)

REPORT_FILE = "report.html"
VIDEOS_DIR = "videos"
_VIDEO_NAME = re.compile(r"eval_episode_(\d+)\.mp4$")

REPORT_JS = """
const EP = LR.data("episode-data");
const points = ok => ({name: ok ? "success" : "failure", points: true, lineOpacity: 0,
  color: ok ? "#1a7f37" : "#c0392b", x: EP.filter(e => e.success === ok).map(e => e.episode_ix),
  y: EP.filter(e => e.success === ok).map(e => e.max_reward)});
LR.chart(document.getElementById("chart-max-reward"), {series: [points(true), points(false)],
  xlabel: "episode", ylabel: "max reward"});
LR.sortable("episodes");
"""


def episode_videos(out_dir: Path) -> dict[int, str]:
    """Episode index -> its video's path relative to `out_dir` (`videos/eval_episode_<i>.mp4`)."""
    videos = Path(out_dir) / VIDEOS_DIR
    found = {}
    if videos.is_dir():
        for path in videos.iterdir():
            match = _VIDEO_NAME.match(path.name)
            if match:
                found[int(match.group(1))] = f"{VIDEOS_DIR}/{path.name}"
    return found


def reproduce_command(info: dict[str, Any]) -> str:
    """The command that runs this evaluation again (its checkpoint or baseline, episodes and seeds)."""
    cfg = info.get("config", {})
    ev = cfg.get("eval", {})
    args = ["python", "scripts/eval.py"]
    checkpoint = info.get("checkpoint")
    if checkpoint:
        args += ["--checkpoint", str(checkpoint["path"])]
        if checkpoint.get("weights") == "raw":
            args.append("--raw-weights")
    else:
        args += [
            f"policy={cfg.get('policy', {}).get('name', '?')}",
            f"env={cfg.get('env', {}).get('name', '?')}",
        ]
    task = cfg.get("env", {}).get("task")
    if task is not None:
        args.append(f"env.task={json.dumps(task, separators=(',', ':')) if isinstance(task, list) else task}")
    for key in ("n_episodes", "start_seed"):
        if key in ev:
            args.append(f"eval.{key}={ev[key]}")
    return shlex.join(args)


def _figures(agg: dict[str, Any]) -> str:
    cards = [
        card(
            "success rate",
            f"{fmt(agg.get('pc_success'), 1)}%",
            f"95% CI {interval(agg.get('pc_success_ci95_low'), agg.get('pc_success_ci95_high'), 1)}",
        ),
        card(
            "average max reward",
            fmt(agg.get("avg_max_reward")),
            f"95% CI {interval(agg.get('avg_max_reward_ci95_low'), agg.get('avg_max_reward_ci95_high'))}",
        ),
        card("average sum reward", fmt(agg.get("avg_sum_reward"), 2)),
        card("episodes", fmt(agg.get("n_episodes"))),
        card(
            "wall time", f"{fmt(agg.get('eval_s'), 1)} s", f"{fmt(agg.get('env_steps_per_s'), 1)} env steps/s"
        ),
    ]
    return f'<div class="cards">{"".join(cards)}</div>'


def _per_task(agg: dict[str, Any], untrained: list[str]) -> str:
    per_task = agg.get("per_task")
    if not per_task:
        return ""
    rows = []
    for task, f in per_task.items():
        name = esc(task) + (' <span class="muted">(not trained on)</span>' if task in untrained else "")
        rows.append(
            [
                name,
                percent_bar(f["pc_success"], f.get("pc_success_ci95_low"), f.get("pc_success_ci95_high")),
                f"{fmt(f['pc_success'], 1)}%",
                interval(f.get("pc_success_ci95_low"), f.get("pc_success_ci95_high"), 1),
                fmt(f["avg_max_reward"]),
                fmt(f["avg_steps"], 1),
                fmt(f["n_episodes"]),
            ]
        )
    mean_success = sum(f["pc_success"] for f in per_task.values()) / len(per_task)
    mean_reward = sum(f["avg_max_reward"] for f in per_task.values()) / len(per_task)
    rows.append(
        [
            "<b>mean over tasks</b>",
            percent_bar(mean_success),
            f"{mean_success:.1f}%",
            "",
            fmt(mean_reward),
            "",
            "",
        ]
    )
    headers = ["task", "success", "", "95% CI", "avg max reward", "avg steps", "episodes"]
    return "<h2>Per task</h2>" + table(headers, rows, numeric=[False, False, True, True, True, True, True])


def _videos(rows: list[dict[str, Any]], videos: dict[int, str]) -> str:
    if not videos:
        return ""
    by_ix = {row["episode_ix"]: row for row in rows}
    figures = []
    for ix in sorted(videos):
        row = by_ix.get(ix, {})
        ok = bool(row.get("success"))
        bits = [f"episode {ix}"]
        if row.get("task"):
            bits.append(esc(row["task"]))
        if "seed" in row:
            bits.append(f"seed {row['seed']}")
        bits += [
            "success" if ok else "failure",
            f"max reward {fmt(row.get('max_reward'))}",
            f"{row.get('n_steps', '?')} steps",
        ]
        figures.append(
            f'<figure id="video-{ix}" class="{"ok" if ok else "fail"}"><video controls muted preload="metadata" '
            f'width="256" src="{esc(videos[ix])}"></video><figcaption>{" &middot; ".join(bits)}</figcaption></figure>'
        )
    return f'<h2>Rendered episodes</h2><div class="videos">{"".join(figures)}</div>'


def _episode_table(rows: list[dict[str, Any]], videos: dict[int, str]) -> str:
    has_task = any("task" in r for r in rows)
    headers = [
        "episode",
        *(["task"] if has_task else []),
        "seed",
        "success",
        "max reward",
        "sum reward",
        "steps",
        "video",
    ]
    body = []
    for r in rows:
        ix = r["episode_ix"]
        video = (
            f'<a href="#video-{ix}">watch</a> <a class="muted" href="{esc(videos[ix])}">mp4</a>'
            if ix in videos
            else ""
        )
        success = f'<span class="{"ok" if r["success"] else "fail"}">{"yes" if r["success"] else "no"}</span>'
        body.append(
            [
                str(ix),
                *([esc(r.get("task", ""))] if has_task else []),
                str(r.get("seed", "")),
                success,
                fmt(r["max_reward"]),
                fmt(r["sum_reward"], 2),
                str(r["n_steps"]),
                video,
            ]
        )
    numeric = [True, *([False] if has_task else []), True, False, True, True, True, False]
    return "<h2>Episodes</h2>" + table(headers, body, numeric=numeric, table_id="episodes")


def _provenance(info: dict[str, Any], out_dir: Path) -> str:
    parts = ["<h2>What ran</h2>"]
    checkpoint = info.get("checkpoint")
    if checkpoint:
        rows = [[esc(k), f"<code>{esc(v)}</code>"] for k, v in checkpoint.items()]
        parts.append("<h3>Checkpoint</h3>" + table(["", ""], rows))
    else:
        parts.append(
            '<p class="muted">No checkpoint recorded (a baseline policy, or a training run\'s own weights).</p>'
        )
    parts.append(f"<h3>Repeat it</h3><pre>{esc(reproduce_command(info))}</pre>")
    config = info.get("config")
    if config:
        text = OmegaConf.to_yaml(OmegaConf.create(config))
        parts.append(f"<details><summary>the config it ran</summary><pre>{esc(text)}</pre></details>")
    parts.append(f'<p><a href="{EVAL_INFO_FILE}">{EVAL_INFO_FILE}</a> holds every figure of this page.</p>')
    return "".join(parts)


def _run_link(out_dir: Path) -> str:
    """A link back to the training run's index when this evaluation lies in `<run>/eval/step_N/`."""
    out_dir = Path(out_dir).resolve()
    if out_dir.parent.name == "eval" and out_dir.name.startswith("step_"):
        run_dir = out_dir.parent.parent
        return (
            f' &middot; <a href="{rel(run_dir / "index.html", out_dir)}">training run {esc(run_dir.name)}</a>'
        )
    return ""


def write_eval_report(out_dir: Path | str, info: dict[str, Any] | None = None) -> Path:
    """Write `out_dir/report.html` for the evaluation `info` (default: read `out_dir/eval_info.json`)."""
    out_dir = Path(out_dir)
    if info is None:
        info = json.loads((out_dir / EVAL_INFO_FILE).read_text())
    agg, rows = info["aggregated"], info["per_episode"]
    cfg = info.get("config", {})
    policy, env = cfg.get("policy", {}).get("name", "policy"), cfg.get("env", {}).get("name", "env")
    videos = episode_videos(out_dir)
    step = (info.get("checkpoint") or {}).get("step")
    subtitle = f"{len(rows)} episodes" + (f", checkpoint at step {step:,}" if isinstance(step, int) else "")
    untrained = list(info.get("tasks_not_trained_on", []))
    episodes = [
        {"episode_ix": r["episode_ix"], "success": bool(r["success"]), "max_reward": r["max_reward"]}
        for r in rows
    ]
    body = "".join(
        [
            f"<h1>Evaluation: {esc(policy)} on {esc(env)}</h1>",
            f'<div class="muted">{esc(subtitle)} &middot; {esc(out_dir.resolve())}{_run_link(out_dir)}</div>',
            _figures(agg),
            _per_task(agg, untrained),
            '<h2>Max reward per episode</h2><div class="charts">',
            chart_div("chart-max-reward", "max reward of each episode (green: success)"),
            "</div>",
            _videos(rows, videos),
            _episode_table(rows, videos),
            _provenance(info, out_dir),
            json_script("episode-data", episodes),
        ]
    )
    return write_page(out_dir / REPORT_FILE, page(f"eval: {policy} on {env}", body, script=REPORT_JS))


def try_write_eval_report(out_dir: Path | str, info: dict[str, Any] | None = None) -> Path | None:
    """`write_eval_report`, with any failure logged as a warning (an evaluation never fails for its page)."""
    try:
        return write_eval_report(out_dir, info)
    except Exception as e:  # noqa: BLE001 (the page is a convenience; the figures are written already)
        log.warning("could not write %s: %s: %s", Path(out_dir) / REPORT_FILE, type(e).__name__, e)
        return None
