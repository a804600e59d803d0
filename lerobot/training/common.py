"""Pieces both trainers and `scripts/eval.py` share: run directory, device, seeding, evaluation."""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lerobot.config import ConfigError, env_config
from lerobot.constants import EVAL_INFO_FILE
from lerobot.envs import make_env, resolve_use_async
from lerobot.policies.factory import inference_context
from lerobot.policies.policy import Policy
from lerobot.rollout import aggregate_episodes, eval_policy
from lerobot.training import distributed
from lerobot.training.checkpoint import remove_stale_temporaries
from lerobot.training.run_dir import lock_run_dir, release_run_dir, resume_checkpoint

log = logging.getLogger(__name__)


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite.

    `update`, when known: the number (1-based, counted in this process) of the first update whose loss was not
    finite. Found at log time (`StepMetrics`), it tells which weights gave that loss: those after update
    `update - 1`.
    """

    def __init__(self, message: str, update: int | None = None):
        super().__init__(message)
        self.update = update


def resolve_device(name: str) -> torch.device:
    """The torch device that `device=<name>` asks for (see `RootConfig.device`), set up for use.

    `auto` picks CUDA when a GPU is present, else MPS (Apple GPU) where available, else the CPU. A named device
    that this machine lacks (`cuda` without a GPU, `cuda:1` with one GPU, `mps` off a Mac) is a config error.
    On CUDA, float32 matmuls and convolutions use TF32 (bf16 autocast is `training.use_amp`).
    """
    if name == "auto":
        if torch.cuda.is_available():
            name = "cuda"
        elif torch.backends.mps.is_available():
            name = "mps"
        else:
            name = "cpu"
    device = torch.device(name)
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if (device.index or 0) >= count:
            have = f"{count} CUDA GPU(s) (cuda:0..cuda:{count - 1})" if count else "no CUDA GPU"
            raise ConfigError(f"device={name} but this machine has {have}; use device=auto or device=cpu")
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(
            f"device={name} but MPS (Apple GPU) is not available here; use device=auto or device=cpu"
        )
    log.info("device: %s", describe_device(device))
    return device


def describe_device(device: torch.device) -> str:
    """`device` as the start-up line shows it, e.g. `cuda:0 (NVIDIA H200)` or `cpu (2 threads)`."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return f"cuda:{index} ({torch.cuda.get_device_name(index)}, TF32 matmuls)"
    if device.type == "cpu":
        return f"cpu ({torch.get_num_threads()} threads)"
    return str(device)


# A CPU run whose measured pace puts its end further away than this gets a warning naming `CPU_RECIPE`.
CPU_WARN_HOURS = 6.0
CPU_RECIPE = "+experiment=diffusion_pusht_keypoints_cpu"
GPU_RECIPE = "+experiment=diffusion_pusht_gpu"


def cpu_run_warning(step_s: float, steps_left: int) -> str | None:
    """The warning for a CPU run of `steps_left` more steps at `step_s` seconds each, or None when it ends
    within `CPU_WARN_HOURS`."""
    hours = step_s * steps_left / 3600
    if hours <= CPU_WARN_HOURS:
        return None
    return (
        f"on the CPU this run takes about {hours:,.0f} hours ({step_s:.2f} s per step, {steps_left:,} steps "
        f"left); the paper-size models need a GPU ({GPU_RECIPE}). A recipe sized for a CPU: {CPU_RECIPE} "
        "(Diffusion Policy on PushT keypoints, about an hour on 2 cores); or lower training.steps"
    )


class CpuPace:
    """Measures the first steps of a CPU run (after `warm_up` steps, which include one-time setup) and logs
    `cpu_run_warning` once, early, when the run would take far too long. Does nothing off the CPU."""

    def __init__(self, device: torch.device, steps_left: int, warm_up: int = 1, measured: int = 2):
        self.active = device.type == "cpu" and steps_left > warm_up + measured
        self.steps_left = steps_left
        self.warm_up, self.measured = warm_up, measured
        self.done = 0
        self._start = 0.0

    def step(self) -> None:
        """Count one finished step; after `warm_up + measured` of them, log the warning if it applies."""
        if not self.active:
            return
        self.done += 1
        if self.done == self.warm_up:
            self._start = time.perf_counter()
        elif self.done == self.warm_up + self.measured:
            self.active = False
            step_s = (time.perf_counter() - self._start) / self.measured
            warning = cpu_run_warning(step_s, self.steps_left - self.done)
            if warning is not None:
                log.warning(warning)


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup_run(cfg: DictConfig) -> tuple[Path, Path | None]:
    """Create (or find) the run directory and lock it; return it and the checkpoint to resume from, if any.

    Without `output_dir` a new, timestamped directory is made (so nothing is resumed automatically). The
    lock (`lerobot.training.run_dir`) is taken before anything is read or written (stale checkpoint
    temporaries are cleared under it), and released when `lerobot.training.train` returns; `training.resume`
    decides between resuming and a fresh start.
    """
    if cfg.output_dir is None:
        if cfg.training.resume == "true":
            raise ConfigError("training.resume=true needs output_dir=<run directory of the run to resume>")
        now = dt.datetime.now()
        cfg.output_dir = str(
            Path("outputs/train")
            / now.strftime("%Y-%m-%d")
            / f"{now:%H-%M-%S}_{cfg.env.name}_{cfg.policy.name}"
        )
    run_dir = Path(cfg.output_dir)
    lock_run_dir(run_dir)
    try:
        remove_stale_temporaries(
            run_dir
        )  # before looking for checkpoints: a complete one may be put in place
        resume_from = resume_checkpoint(cfg, run_dir)
    except BaseException:
        release_run_dir(run_dir)
        raise
    log.info(
        "run directory: %s (%s)", run_dir, f"resuming from {resume_from.name}" if resume_from else "new run"
    )
    return run_dir, resume_from


def evaluate(cfg: DictConfig, policy: Policy, out_dir: Path, progress: bool = False) -> dict[str, Any]:
    """Run `eval_policy` with the `eval` settings of `cfg`; write `out_dir/eval_info.json` and videos.

    The env count is `min(eval.batch_size, episodes)`, sync or async per `eval.use_async_envs`. On N
    processes (`distributed`) each one runs its contiguous share of the episodes, episode i with seed
    `eval.start_seed + i` as on one process, in its own vector env of up to `eval.batch_size` envs; the
    per-episode results are merged in episode order and aggregated once (identical to the one-process run
    for a deterministic policy), and the main process writes `eval_info.json` and the videos (of its own
    episodes, the first ones). Every process returns the merged results.
    """
    start, stop = distributed.share(cfg.eval.n_episodes)
    main = distributed.is_main()
    part = None
    if stop > start:
        part = _evaluate_episodes(
            cfg,
            policy,
            start,
            stop,
            max_episodes_rendered=cfg.eval.max_episodes_rendered if main else 0,
            videos_dir=Path(out_dir) / "videos" if main else None,
            progress=progress and main,
        )
    parts = [(s, p) for s, p in distributed.gather((start, part)) if p is not None]
    info = parts[0][1] if len(parts) == 1 else merge_eval_parts(parts)
    info["config"] = OmegaConf.to_container(cfg, resolve=True)
    if main:
        write_json(Path(out_dir) / EVAL_INFO_FILE, info)
    return info


def _evaluate_episodes(
    cfg: DictConfig,
    policy: Policy,
    start: int,
    stop: int,
    max_episodes_rendered: int,
    videos_dir: Path | None,
    progress: bool,
) -> dict[str, Any]:
    """`eval_policy` over episodes `[start, stop)` (seeds `eval.start_seed + i`) in a vector env of its own;
    its rows count episodes from 0."""
    env_cfg = env_config(cfg)
    n_episodes = stop - start
    n_envs = min(cfg.eval.batch_size, n_episodes)
    use_async = resolve_use_async(cfg.eval.use_async_envs, env_cfg, n_envs)
    log.info(
        "evaluating %s on %s: episodes %d-%d of %d, %d %s envs",
        cfg.policy.name,
        env_cfg.name,
        start,
        stop - 1,
        cfg.eval.n_episodes,
        n_envs,
        "async" if use_async else "sync",
    )
    env = make_env(env_cfg, n_envs, use_async=use_async, copy=False)
    try:
        # The policy's registered inference layer (e.g. Diffusion's CPU fast path), if its config enables it,
        # built from the policy in eval mode.
        policy.eval()
        with inference_context(policy):
            return eval_policy(
                env,
                policy,
                n_episodes,
                start_seed=cfg.eval.start_seed + start,
                max_episodes_rendered=max_episodes_rendered,
                videos_dir=videos_dir,
                progress=progress,
                step_timeout_s=cfg.eval.step_timeout_s,
                schedule=cfg.eval.schedule,
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


def write_json(path: Path, data: Any) -> None:
    """Write JSON atomically."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(data, indent=2))
    tmp.replace(path)
