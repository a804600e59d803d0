"""Pieces both trainers and `scripts/eval.py` share: run directory, device, seeding, evaluation."""

from __future__ import annotations

import datetime as dt
import json
import logging
import random
from pathlib import Path
from typing import Any

import numpy as np
import torch
from omegaconf import DictConfig, OmegaConf

from lerobot.config import ConfigError, env_config
from lerobot.envs import make_env, resolve_use_async
from lerobot.policies.factory import inference_context
from lerobot.policies.policy import Policy
from lerobot.rollout import aggregate_episodes, eval_policy
from lerobot.training import distributed
from lerobot.training.checkpoint import latest_checkpoint, remove_stale_temporaries

log = logging.getLogger(__name__)


class TrainingDivergedError(RuntimeError):
    """The loss became NaN or infinite."""


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; `cuda` without a GPU is a config error."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda") and not torch.cuda.is_available():
        raise ConfigError(f"device={name} but no CUDA GPU is available; use device=cpu")
    return torch.device(name)


def set_seed(seed: int) -> None:
    """Seed python, numpy and torch."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def setup_run(cfg: DictConfig) -> tuple[Path, Path | None]:
    """Create (or find) the run directory; return it and the checkpoint to resume from, if any.

    `training.resume=true` needs `output_dir` pointing at an earlier run that holds a checkpoint.
    """
    if cfg.output_dir is None:
        if cfg.training.resume:
            raise ConfigError("training.resume=true needs output_dir=<run directory of the run to resume>")
        now = dt.datetime.now()
        cfg.output_dir = str(
            Path("outputs/train")
            / now.strftime("%Y-%m-%d")
            / f"{now:%H-%M-%S}_{cfg.env.name}_{cfg.policy.name}"
        )
    run_dir = Path(cfg.output_dir)
    remove_stale_temporaries(run_dir)  # before looking for checkpoints: a complete one may be put in place
    resume_from = None
    if cfg.training.resume:
        resume_from = latest_checkpoint(run_dir)
        if resume_from is None:
            raise ConfigError(
                f"training.resume=true but {run_dir} holds no checkpoint (checkpoints/last); "
                "pass output_dir=<run directory of the run to resume>"
            )
    elif latest_checkpoint(run_dir) is not None:
        raise ConfigError(
            f"{run_dir} already holds checkpoints; pass training.resume=true to continue it or pick another output_dir"
        )
    run_dir.mkdir(parents=True, exist_ok=True)
    log.info("run directory: %s", run_dir)
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
        write_json(Path(out_dir) / "eval_info.json", info)
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
