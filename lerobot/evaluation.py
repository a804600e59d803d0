"""Evaluating a policy as a run config says: the vector env, the episodes of this process, the merged figures
and `eval_info.json`. Used by `scripts/eval.py` and by the trainers' periodic evaluation.

An evaluation writes `eval_info.json` and `videos/` into its output directory (`earlier_evaluation` says
whether one is there already, `remove_evaluation` deletes it); nothing else of that directory is touched but
the temporaries of those files that a killed evaluation left, which the next one deletes."""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import math
import shutil
from collections.abc import Collection, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from lerobot import distributed
from lerobot.accel import accelerated
from lerobot.config import EnvConfig, env_config
from lerobot.constants import EVAL_INFO_FILE, VISUAL
from lerobot.datasets.recording import EpisodeRecorder, remove_stale_recordings, spill_dir
from lerobot.envs import make_env
from lerobot.envs.factory import check_env_settings, env_task_names, plan_vector_env
from lerobot.envs.tasks import EpisodeSpec, episode_plan
from lerobot.episode_stats import aggregate_episodes
from lerobot.errors import ConfigError, DatasetExistsError, EnvWorkerError
from lerobot.policies.policy import Policy
from lerobot.reports.eval_report import REPORT_FILE, try_write_eval_report
from lerobot.rollout import eval_policy
from lerobot.runtime.files import TemporaryDir, no_space_error, remove_dead_writers_temporaries, write_json

log = logging.getLogger(__name__)

# Where the rendered episodes go, in the output directory.
VIDEOS_DIR = "videos"


def evaluate(
    cfg: DictConfig,
    policy: Policy,
    out_dir: Path,
    progress: bool = False,
    checkpoint: dict[str, Any] | None = None,
    untrained_tasks: Sequence[str] = (),
) -> dict[str, Any]:
    """Run `eval_policy` with the `eval` settings of `cfg`; write `out_dir/eval_info.json` and videos.

    `checkpoint`: which weights `policy` holds (`lerobot.checkpoints.checkpoint_record`), recorded in
    `eval_info.json` under `checkpoint`; None records nothing (a baseline policy, a training run's own).
    `untrained_tasks`: the tasks of `env.task` the policy was not trained on (evaluated under
    `eval.allow_untrained_tasks=true`), recorded under `tasks_not_trained_on`.

    The episodes: `eval.n_episodes` with seeds `eval.start_seed + k`, of each task of a multi-task env
    (`env.task`), task by task. The env count is `min(eval.batch_size, episodes)` (`auto`: what fits the
    machine, `lerobot.envs.factory.plan_vector_env`), sync or async per `eval.use_async_envs`: slots run any
    task, so memory grows with the slots, not the tasks. On N
    processes (`distributed`) each one runs its contiguous share of the episodes, each with its own task and
    seed as on one process, in its own vector env of up to `eval.batch_size` envs; the
    per-episode results are merged in episode order and aggregated once (identical to the one-process run
    for a deterministic policy), and the main process writes `eval_info.json` and the videos (of its own
    episodes, the first ones). Every process returns the merged results.
    """
    record = cfg.eval.get("record_dataset")
    if record is not None:
        check_record_dataset(record)
    plan = episode_plan(cfg.eval.n_episodes, cfg.eval.start_seed, env_task_names(env_config(cfg)))
    start, stop = distributed.share(len(plan))
    main = distributed.is_main()
    if main:  # what a killed evaluation into `out_dir` left (a video or eval_info.json cut short)
        for directory in (Path(out_dir), Path(out_dir) / VIDEOS_DIR):
            remove_dead_writers_temporaries(directory)
    part, record_error = None, None
    with contextlib.ExitStack() as stack:
        recorder = None
        if record is not None:
            # `eval.record_dataset=outputs/data/NAME` in a fresh directory: the spill goes beside NAME.
            Path(record).parent.mkdir(parents=True, exist_ok=True)
            remove_stale_recordings(record)
            spill = stack.enter_context(TemporaryDir(spill_dir(record)))
            recorder = EpisodeRecorder(spill.path)
        if stop > start:
            part = _evaluate_episodes(
                cfg,
                policy,
                plan[start:stop],
                max_episodes_rendered=cfg.eval.max_episodes_rendered if main else 0,
                videos_dir=Path(out_dir) / VIDEOS_DIR if main else None,
                progress=progress and main,
                recorder=recorder,
            )
        if recorder is not None:
            record_error = _write_recording(recorder, record, env_config(cfg), len(plan), out_dir)
    video_error = part.pop("video_error", None) if part is not None else None
    parts = [(s, p) for s, p in distributed.gather((start, part)) if p is not None]
    info = parts[0][1] if len(parts) == 1 else merge_eval_parts(parts)
    clip_reward_interval(info["aggregated"], env_config(cfg).reward_range)
    if checkpoint is not None:
        info["checkpoint"] = checkpoint
    if untrained_tasks:
        info["tasks_not_trained_on"] = list(untrained_tasks)
    info["config"] = OmegaConf.to_container(cfg, resolve=True)
    if main:
        write_json(Path(out_dir) / EVAL_INFO_FILE, info)
        try_write_eval_report(out_dir, info)  # report.html; a failure is a warning
    if record_error is not None:
        raise record_error  # after the figures are written: the evaluation is kept without its dataset
    if video_error is not None:
        # The figures are written (when they fit); the videos that did not fit were never put in place.
        raise _videos_not_written(video_error, out_dir)
    return info


def _write_recording(
    recorder: EpisodeRecorder, record: str, env_cfg: EnvConfig, n_episodes: int, out_dir: Path
) -> Exception | None:
    """Write the `n_episodes` episodes that `recorder` holds as the LeRobotDataset of
    `eval.record_dataset=record`; return the error that kept it from being written (raised by `evaluate` once
    the figures are written), or None when it was written. An error other than a concurrent recording or a
    full disk is raised."""
    try:
        recorder.write(record, fps=env_cfg.fps, task=env_cfg.name, name=env_cfg.name)
        log.info("recorded %d episodes as a LeRobotDataset in %s", n_episodes, record)
    except DatasetExistsError:  # a concurrent recording into `record` finished first
        return DatasetExistsError(
            f"eval.record_dataset={record} was not written: another recording took that directory "
            f"while this evaluation ran (its dataset is kept); this evaluation's figures are in "
            f"{Path(out_dir) / EVAL_INFO_FILE}; record into a new directory to keep its episodes"
        )
    except Exception as e:  # a full disk costs the dataset, not the evaluation's figures
        full = no_space_error(e)
        if full is None:
            raise
        # The dataset's temporaries are gone (the spill's space is free again).
        return OSError(
            full.errno,
            full.strerror,
            f"{full.filename} (eval.record_dataset={record} was not written and nothing of it is "
            f"left; the evaluation's figures are in {Path(out_dir) / EVAL_INFO_FILE})",
        )
    return None


def _videos_not_written(video_error: OSError, out_dir: Path) -> OSError:
    """The error `evaluate` raises when a full disk stopped a video (`video_error`), after the figures."""
    return OSError(
        video_error.errno,
        video_error.strerror,
        f"{video_error.filename} (the evaluation's figures are in {Path(out_dir) / EVAL_INFO_FILE}; "
        "the videos that did not fit were not written)",
    )


def check_run_env(cfg: DictConfig, evaluates: bool = True) -> None:
    """Check the run's env settings before any work: one env built and reset (`check_env_settings`), and a
    frame rendered when the run renders (camera observations; eval videos when it `evaluates`), so that a bad
    setting or an OpenGL backend that cannot render is one line at start-up rather than a failure at the first
    evaluation."""
    env_cfg = env_config(cfg)
    cameras = [key for key, feature in env_cfg.input_features().items() if feature.kind == VISUAL]
    renders = None
    if cameras:
        renders = f"camera observations ({', '.join(cameras)})"
    elif evaluates and cfg.eval.max_episodes_rendered > 0:
        renders = f"eval videos (eval.max_episodes_rendered={cfg.eval.max_episodes_rendered}; 0 renders none)"
    check_env_settings(env_cfg, renders)


def untrained_tasks(trained_task: Any, env_cfg: EnvConfig) -> list[str]:
    """The tasks of `env_cfg.task` that a policy trained with `env.task=trained_task` was not trained on, in
    evaluation order; none when either names no tasks (a single-task env, a checkpoint that records none)."""
    tasks = env_task_names(env_cfg)
    if tasks is None or trained_task is None:
        return []
    trained = env_task_names(dataclasses.replace(env_cfg, task=trained_task))
    return [task for task in tasks if task not in trained]


def clip_reward_interval(aggregated: dict[str, Any], reward_range: list[float] | None) -> None:
    """Clip the 95% interval of `avg_max_reward` in `aggregated` to the env's `reward_range` (in place).

    The mean of max rewards lies within the reward's bounds; the normal interval around it does not at a few
    episodes (two episodes of 0.0 and 0.58 give [-0.278, 0.858]), so it is cut at the bounds there. Where it
    lies within them (the usual case from a few dozen episodes) nothing changes. None: bounds not known.
    """
    if reward_range is None:
        return
    low, high = reward_range
    for key in ("avg_max_reward_ci95_low", "avg_max_reward_ci95_high"):
        if key in aggregated and not math.isnan(aggregated[key]):
            aggregated[key] = min(max(aggregated[key], low), high)


def check_record_dataset(path: str) -> None:
    """Raise `ConfigError` when `eval.record_dataset=path` cannot be written: it exists, or the evaluation
    runs on several processes (each records its own episodes; one process writes the dataset)."""
    if Path(path).exists():
        raise ConfigError(
            f"eval.record_dataset={path}: already exists; choose a new directory (or delete that one)"
        )
    if distributed.world_size() > 1:
        raise ConfigError(
            f"eval.record_dataset={path}: recording needs a one-process evaluation (without torchrun)"
        )


def earlier_evaluation(out_dir: Path) -> str | None:
    """What an earlier evaluation left in `out_dir` (`eval_info.json`, videos), in words; None when nothing
    (an empty `videos/` counts as nothing, and so do the hidden temporaries of videos never finished)."""
    out_dir = Path(out_dir)
    found = []
    if (out_dir / EVAL_INFO_FILE).exists():
        found.append(EVAL_INFO_FILE)
    videos = out_dir / VIDEOS_DIR
    written = [p for p in videos.iterdir() if not p.name.startswith(".")] if videos.is_dir() else []
    if written:
        found.append(f"{len(written)} file(s) in {VIDEOS_DIR}/")
    return " and ".join(found) or None


def remove_evaluation(out_dir: Path) -> None:
    """Delete what an evaluation wrote into `out_dir` (`eval_info.json`, `videos/`), and nothing else."""
    (Path(out_dir) / EVAL_INFO_FILE).unlink(missing_ok=True)
    (Path(out_dir) / REPORT_FILE).unlink(missing_ok=True)
    shutil.rmtree(Path(out_dir) / VIDEOS_DIR, ignore_errors=True)


def _evaluate_episodes(
    cfg: DictConfig,
    policy: Policy,
    plan: list[EpisodeSpec],
    max_episodes_rendered: int,
    videos_dir: Path | None,
    progress: bool,
    recorder: EpisodeRecorder | None = None,
) -> dict[str, Any]:
    """`eval_policy` over the episodes `plan` in a vector env of its own; its rows count episodes from 0."""
    env_cfg = env_config(cfg)
    n_episodes = len(plan)
    vector = plan_vector_env(cfg.eval.batch_size, cfg.eval.use_async_envs, env_cfg, n_episodes)
    n_envs, use_async = vector.n_envs, vector.use_async
    if vector.line is not None:
        log.info(vector.line)
    tasks = sorted({spec.task for spec in plan if spec.task is not None})
    log.info(
        "evaluating %s on %s: %d episodes%s, %d %s envs",
        cfg.policy.name,
        env_cfg.name,
        n_episodes,
        f" of {len(tasks)} tasks" if tasks else "",
        n_envs,
        "async" if use_async else "sync",
    )
    try:
        env = make_env(env_cfg, n_envs, use_async=use_async, copy=False)
    except EnvWorkerError as e:  # workers that could not start: fewer of them, or none, can
        raise EnvWorkerError(
            f"{e}: lower eval.batch_size (now {n_envs}) or set eval.use_async_envs=false"
        ) from None
    try:
        # The policy's registered inference layer (e.g. Diffusion's CPU fast path) as the run's `inference`
        # section asks, built from the policy in eval mode.
        policy.eval()
        with accelerated(policy, cfg.inference):
            return eval_policy(
                env,
                policy,
                n_episodes,
                plan=plan,
                max_episodes_rendered=max_episodes_rendered,
                videos_dir=videos_dir,
                progress=progress,
                step_timeout_s=cfg.eval.step_timeout_s,
                schedule=cfg.eval.schedule,
                recorder=recorder,
            )
    finally:
        env.close()


def merge_eval_parts(parts: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """One `eval_policy` result from the results of consecutive episode ranges run side by side.

    Args:
        parts: `(first episode index, eval_policy result)` per range, in episode order.

    Returns:
        The per-episode rows renumbered and concatenated, figures aggregated over all of them, the wall
        time of the slowest range, and every range's video paths.
    """
    per_episode = [
        {**row, "episode_ix": first + row["episode_ix"]} for first, p in parts for row in p["per_episode"]
    ]
    aggs = [p["aggregated"] for _, p in parts]
    busy = sum(a["env_steps"] for a in aggs)
    # Each range's slot steps (idle slots included), recovered from its utilization.
    slots = sum(round(a["env_steps"] / a["slot_utilization"]) for a in aggs)
    aggregated = aggregate_episodes(per_episode, max(a["eval_s"] for a in aggs), busy, slots)
    return {
        "per_episode": per_episode,
        "aggregated": aggregated,
        "video_paths": [path for _, p in parts for path in p["video_paths"]],
    }


def per_task_table(aggregated: dict[str, Any], untrained_tasks: Collection[str] = ()) -> str | None:
    """The per-task figures of a multi-task evaluation as a text table (None for a single-task one): success
    with its 95% interval, average max reward, mean steps, episodes; then the mean over tasks. The rows of
    `untrained_tasks` say that the policy was not trained on them."""
    per_task = aggregated.get("per_task")
    if not per_task:
        return None
    names = {task: f"{task} (not trained on)" if task in untrained_tasks else task for task in per_task}
    width = max(len(name) for name in [*names.values(), "mean over tasks"])
    lines = [f"{'task':<{width}}  success % [95% CI]       avg max reward  avg steps  episodes"]
    for task, f in per_task.items():
        interval = f"[{f['pc_success_ci95_low']:5.1f}, {f['pc_success_ci95_high']:5.1f}]"
        lines.append(
            f"{names[task]:<{width}}  {f['pc_success']:5.1f} {interval:<16}  {f['avg_max_reward']:14.3f}  "
            f"{f['avg_steps']:9.1f}  {f['n_episodes']:8d}"
        )
    mean_success = sum(f["pc_success"] for f in per_task.values()) / len(per_task)
    mean_reward = sum(f["avg_max_reward"] for f in per_task.values()) / len(per_task)
    lines.append(f"{'mean over tasks':<{width}}  {mean_success:5.1f} {'':<16}  {mean_reward:14.3f}")
    return "\n".join(lines)
