"""Batched evaluation: run a `Policy` in a gymnasium vector env and count every episode exactly.

The acting path reads top to bottom in `eval_policy`:
env -> observation -> `observation_to_batch` -> `policy.select_action` -> action -> env.

Exactness rules:
- Episode i is reset with seed `start_seed + i`, whichever slot (env index) runs it, so per-episode results
  do not depend on `num_envs` or on sync vs async.
- An episode's figures count its steps up to and including its first done (terminated or truncated) step.
  The moment an episode ends its slot is reset explicitly (`reset_mask`; with an idle seed while it waits
  for its next episode), and when its next episode starts the slot is reset with that episode's seed and
  the policy's history and action queue for that slot are cleared, so nothing from gymnasium's autoreset
  and no queued action of an earlier episode reaches a new one. This works for every autoreset mode.
- Scheduling: with `schedule="refill"` a slot starts the next pending episode as soon as its episode
  ends; with `schedule="refill_aligned"` (default) it starts it at the next step where the other slots get
  new action chunks (at most `n_action_steps - 1` idle steps; at once when no other slot is running), so
  one batched chunk prediction keeps serving all slots instead of one per chunk phase (plain refill
  spreads the slots over every phase: 2x slower evaluation of the trained Diffusion Policy here, see
  docs/benchmarks.md); `schedule="batch"` waits until every slot is done (fixed batches of `num_envs`).
  All give identical per-episode results for a deterministic policy.
"""

from __future__ import annotations

import math
import multiprocessing
import os
import tempfile
import time
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv, VectorEnv
from tqdm.auto import tqdm

from lerobot.constants import EVAL_SCHEDULES
from lerobot.envs.observation import observation_to_batch
from lerobot.policies.policy import Policy

# A reset that takes longer than this means a worker hangs; fail instead of waiting forever. Steps wait
# without a timeout unless `eval_policy(step_timeout_s=...)` asks for one: gymnasium enforces it by polling
# every worker's pipe each step, which cost 10-15% of the evaluation rate with 4-8 keypoint envs here.
ASYNC_RESET_TIMEOUT_S = 120.0


class EnvWorkerError(RuntimeError):
    """An async env worker died or stopped answering."""


def policy_device(policy: torch.nn.Module) -> torch.device:
    """The device of the policy's parameters or buffers (CPU for a policy with neither)."""
    for tensor in (*policy.parameters(), *policy.buffers()):
        return tensor.device
    return torch.device("cpu")


def _step(env: VectorEnv, action: np.ndarray, timeout_s: float | None = None):
    if not isinstance(env, AsyncVectorEnv):
        return env.step(action)
    try:
        env.step_async(action)
        return env.step_wait(timeout=timeout_s)
    except (EOFError, BrokenPipeError, ConnectionResetError) as e:
        raise EnvWorkerError(
            f"an env worker process died during step ({type(e).__name__}); see its log above"
        ) from None
    except (TimeoutError, multiprocessing.TimeoutError):  # gymnasium raises the latter
        raise EnvWorkerError(f"an env worker did not answer a step within {timeout_s:.0f} s") from None


def _reset(env: VectorEnv, seeds: list[int | None], mask: np.ndarray | None):
    options = None if mask is None else {"reset_mask": mask}
    if not isinstance(env, AsyncVectorEnv):
        return env.reset(seed=seeds, options=options)
    try:
        env.reset_async(seed=seeds, options=options)
        return env.reset_wait(timeout=ASYNC_RESET_TIMEOUT_S)
    except (EOFError, BrokenPipeError, ConnectionResetError) as e:
        raise EnvWorkerError(f"an env worker process died during reset ({type(e).__name__})") from None
    except (TimeoutError, multiprocessing.TimeoutError):  # gymnasium raises the latter
        raise EnvWorkerError(
            f"an env worker did not answer a reset within {ASYNC_RESET_TIMEOUT_S:.0f} s"
        ) from None


def _success(info: dict[str, Any], num_envs: int) -> np.ndarray:
    """Per-env `is_success` of the step just taken (read from `final_info` where SAME_STEP autoreset hid it).

    Envs that did not report `is_success` read False: gymnasium fills their entries with zeros.
    """
    success = info.get("is_success")
    success = np.zeros(num_envs, dtype=bool) if success is None else success.astype(bool, copy=False)
    final = info.get("final_info")
    if isinstance(final, dict) and "is_success" in final:
        has_final = np.asarray(info.get("_final_info", np.ones(num_envs, dtype=bool)), dtype=bool)
        success = np.where(has_final, np.asarray(final["is_success"], dtype=bool), success)
    return success


def _render(env: VectorEnv, slots: list[int]) -> list[np.ndarray]:
    """RGB frames of `slots`; a sync env renders only those, an async one renders in its workers."""
    if isinstance(env, SyncVectorEnv):
        return [env.envs[s].render() for s in slots]
    images = env.call("render")
    return [images[s] for s in slots]


def _write_video(path: Path, frames: list[np.ndarray], fps: int) -> Path:
    import imageio.v2 as imageio

    # A unique temporary name in the same folder, renamed when complete: no half-written video remains.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".mp4")
    os.close(fd)
    try:
        imageio.mimsave(tmp, frames, fps=fps, macro_block_size=1)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    return path


@torch.no_grad()  # nothing here needs autograd; entered once instead of at every chunk
def eval_policy(
    env: VectorEnv,
    policy: Policy,
    n_episodes: int,
    start_seed: int = 0,
    max_episodes_rendered: int = 0,
    videos_dir: Path | str | None = None,
    progress: bool = True,
    schedule: str = "refill_aligned",
    step_timeout_s: float | None = None,
) -> dict[str, Any]:
    """Evaluate `policy` for `n_episodes` on the vector env `env` and return per-episode and aggregate metrics.

    Returns `{"per_episode": [{"episode_ix", "seed", "sum_reward", "max_reward", "success", "n_steps"}],
    "aggregated": {"avg_sum_reward", "avg_max_reward", "pc_success", "eval_s", "eval_ep_s", "env_steps",
    "env_steps_per_s", "slot_utilization"}, "video_paths": [...]}` with episodes ordered by index.
    `slot_utilization` is busy env-steps / total env-steps (idle slots waiting for others count as waste).
    With an `AsyncVectorEnv`, a dead worker raises `EnvWorkerError` at once; a hung one does so after
    `step_timeout_s` if given (checking costs time every step, see `ASYNC_RESET_TIMEOUT_S`).
    """
    if n_episodes <= 0:
        raise ValueError(f"n_episodes={n_episodes} must be > 0")
    if schedule not in EVAL_SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: expected one of {EVAL_SCHEDULES}")
    if max_episodes_rendered > 0 and videos_dir is None:
        raise ValueError("max_episodes_rendered > 0 needs a videos_dir")
    num_envs = env.num_envs
    device = policy_device(policy)
    fps = int(env.metadata.get("render_fps") or 10)
    policy.eval()
    policy.reset()

    slot_ep = np.full(num_envs, -1, dtype=np.int64)  # episode index each slot runs, -1 = idle
    # Running figures of each slot's current episode, copied to the episode's row when it ends.
    slot_sum = np.zeros(num_envs)
    slot_max = np.full(num_envs, -np.inf)
    slot_success = np.zeros(num_envs, dtype=bool)
    log = _StepLog(slot_sum, slot_max, slot_success)
    slot_start = np.zeros(num_envs, dtype=np.int64)  # vector step at which the slot's episode began
    sum_reward = np.zeros(n_episodes)
    max_reward = np.full(n_episodes, -np.inf)
    success = np.zeros(n_episodes, dtype=bool)
    n_steps = np.zeros(n_episodes, dtype=np.int64)
    frames: dict[int, list[np.ndarray]] = {}
    video_jobs: list[Future] = []
    writer = ThreadPoolExecutor(max_workers=1) if max_episodes_rendered > 0 else None
    if videos_dir is not None:
        videos_dir = Path(videos_dir)
        videos_dir.mkdir(parents=True, exist_ok=True)

    next_ep = 0
    vector_step = 0
    # refill_aligned: finished slots waiting for the next chunk step (reset with idle seeds meanwhile).
    waiting = np.zeros(num_envs, dtype=bool)
    n_waiting = 0  # waiting.sum(), kept as an int: the loop tests it every step
    # Idle slots still step (a vector env steps all of them); they get seeds past the evaluated range.
    idle_seed = start_seed + n_episodes

    def assign(slots: np.ndarray) -> list[int | None]:
        nonlocal next_ep, idle_seed
        seeds: list[int | None] = [None] * num_envs
        for slot in slots:
            if next_ep < n_episodes:
                slot_ep[slot] = next_ep
                seeds[slot] = start_seed + next_ep
                if next_ep < max_episodes_rendered:
                    frames[next_ep] = []
                next_ep += 1
            else:
                slot_ep[slot] = -1
                seeds[slot] = idle_seed
                idle_seed += 1
        slot_sum[slots] = 0.0
        slot_max[slots] = -np.inf
        slot_success[slots] = False
        slot_start[slots] = vector_step
        return seeds

    def record_frames(slots: np.ndarray) -> None:
        recording = [s for s in slots if slot_ep[s] in frames]
        if recording:
            for s, image in zip(recording, _render(env, recording)):
                frames[slot_ep[s]].append(np.asarray(image))

    async_env = isinstance(env, AsyncVectorEnv)
    start = time.perf_counter()
    busy_steps = total_steps = 0
    bar = tqdm(total=n_episodes, desc="eval episodes", disable=not progress, leave=False)
    try:
        obs, _ = _reset(env, assign(np.arange(num_envs)), None)
        record_frames(np.arange(num_envs))
        n_active = int((slot_ep >= 0).sum())
        while n_active > 0 or n_waiting > 0:
            if n_waiting > 0 and (n_active == 0 or policy.steps_until_chunk() == 0):
                # Start the waiting slots' episodes now: their first chunk joins the others' batch.
                to_reset = np.flatnonzero(waiting)
                waiting[:] = False
                n_waiting = 0
                log.flush()  # before `assign` zeroes these slots' figures
                obs = _reset_slots(env, policy, obs, assign(to_reset), to_reset)
                record_frames(to_reset)
                n_active = int((slot_ep >= 0).sum())
            # Most steps pop queued actions: no observation to convert (or move to a GPU) then.
            batch = observation_to_batch(obs, device) if policy.wants_observation() else None
            action = policy.select_action(batch, as_numpy=True)
            if async_env:
                obs, reward, terminated, truncated, info = _step(env, action, step_timeout_s)
            else:
                obs, reward, terminated, truncated, info = env.step(action)
            vector_step += 1
            total_steps += num_envs
            busy_steps += n_active
            # Idle slots are logged too; their figures are discarded.
            log.append(reward, info)
            if frames:
                record_frames(np.flatnonzero(slot_ep >= 0))

            # count_nonzero is the cheapest test of a small bool array (`ndarray.any` runs Python code).
            if not (np.count_nonzero(terminated) or np.count_nonzero(truncated)):
                continue
            finished = np.flatnonzero((terminated | truncated) & (slot_ep >= 0))
            if finished.size == 0:
                continue
            log.flush()
            eps = slot_ep[finished]
            sum_reward[eps] = slot_sum[finished]
            max_reward[eps] = slot_max[finished]
            success[eps] = slot_success[finished]
            n_steps[eps] = vector_step - slot_start[finished]
            for slot, ep in zip(finished, eps.tolist()):
                if ep in frames and writer is not None:
                    path = videos_dir / f"eval_episode_{ep}.mp4"
                    video_jobs.append(writer.submit(_write_video, path, frames.pop(ep), fps))
                slot_ep[slot] = -1
            bar.update(len(finished))
            bar.set_postfix(env_steps=busy_steps)
            if next_ep == n_episodes and not (slot_ep >= 0).any():
                break  # every episode has ended: no slot needs a reset
            n_active = int((slot_ep >= 0).sum())
            # Aligned refill need not wait when no slot runs or the next step is a chunk step anyway.
            start_now = schedule == "refill" or (
                schedule == "refill_aligned" and (n_active == 0 or policy.steps_until_chunk() == 0)
            )
            if start_now:
                to_reset = finished
            elif schedule == "batch" and n_active == 0:
                to_reset = np.arange(num_envs)
            else:
                # The slot idles (reset so it stays steppable) until its next episode starts. Aligned
                # refill keeps its policy state, so its queue keeps the other slots' chunk phase.
                seeds: list[int | None] = [None] * num_envs
                for slot in finished:
                    seeds[slot] = idle_seed
                    idle_seed += 1
                if schedule == "refill_aligned":
                    waiting[finished] = next_ep < n_episodes
                    n_waiting = int(waiting.sum())
                    obs, _ = _reset(env, seeds, _mask(num_envs, finished))
                else:
                    obs = _reset_slots(env, policy, obs, seeds, finished)
                continue
            obs = _reset_slots(env, policy, obs, assign(to_reset), to_reset)
            record_frames(to_reset)
            n_active = int((slot_ep >= 0).sum())
    finally:
        bar.close()
    video_paths = [str(job.result()) for job in video_jobs]
    if writer is not None:
        writer.shutdown()
    eval_s = time.perf_counter() - start

    per_episode = [
        {
            "episode_ix": i,
            "seed": start_seed + i,
            "sum_reward": float(sum_reward[i]),
            "max_reward": float(max_reward[i]),
            "success": bool(success[i]),
            "n_steps": int(n_steps[i]),
        }
        for i in range(n_episodes)
    ]
    aggregated = {
        "avg_sum_reward": float(np.mean(sum_reward)),
        "avg_max_reward": float(np.mean(max_reward)),
        "pc_success": float(100.0 * np.mean(success)),
        "eval_s": eval_s,
        "eval_ep_s": eval_s / n_episodes,
        "env_steps": int(busy_steps),
        "env_steps_per_s": busy_steps / eval_s if eval_s > 0 else math.nan,
        "slot_utilization": busy_steps / total_steps if total_steps else math.nan,
    }
    return {"per_episode": per_episode, "aggregated": aggregated, "video_paths": video_paths}


class _StepLog:
    """Each step's rewards and successes (B,), folded into the slots' running figures only when read.

    A step copies its values into preallocated `(MAX_STEPS, B)` buffers (two numpy item assignments); the
    sums, maxima and successes are computed once per `flush`. Measured on one keypoints env, main-thread
    CPU time per step over the env's own: per-step ufuncs on the running figures +17 us, keeping each
    step's arrays and info dict in a list +20 us (new memory every step instead of the memory the env just
    freed), copying into these buffers +0 within noise.
    """

    # Folded at least this often.
    MAX_STEPS = 256

    def __init__(self, slot_sum: np.ndarray, slot_max: np.ndarray, slot_success: np.ndarray):
        self.slot_sum, self.slot_max, self.slot_success = slot_sum, slot_max, slot_success
        self.num_envs = len(slot_sum)
        # Row 0 holds the slots' sums so far when folding, so that the fold is one running sum.
        self.rewards = np.zeros((self.MAX_STEPS + 1, self.num_envs))
        self.successes = np.zeros((self.MAX_STEPS, self.num_envs), dtype=bool)
        self.size = 0

    def append(self, reward: np.ndarray, info: dict[str, Any]) -> None:
        """Log one step's (B,) rewards and the successes its info reports."""
        size = self.size
        self.rewards[size + 1] = reward
        if "final_info" in info or "is_success" not in info:  # rare: let `_success` sort it out
            self.successes[size] = _success(info, self.num_envs)
        else:
            self.successes[size] = info["is_success"]
        self.size = size + 1
        if self.size == self.MAX_STEPS:
            self.flush()

    def flush(self) -> None:
        """Add the logged steps to the slots' figures (call before reading or resetting them)."""
        size = self.size
        if size == 0:
            return
        self.rewards[0] = self.slot_sum
        # A running sum in step order, not `sum` (pairwise): the same float result as adding step by step.
        self.slot_sum[:] = self.rewards[: size + 1].cumsum(axis=0)[-1]
        np.maximum(self.slot_max, self.rewards[1 : size + 1].max(axis=0), out=self.slot_max)
        self.slot_success |= self.successes[:size].any(axis=0)
        self.size = 0


def _mask(num_envs: int, slots: np.ndarray) -> np.ndarray:
    mask = np.zeros(num_envs, dtype=bool)
    mask[slots] = True
    return mask


def _reset_slots(env: VectorEnv, policy: Policy, obs: Any, seeds: list[int | None], slots: np.ndarray) -> Any:
    """Reset only `slots` (with their seeds) and clear their policy state; other slots keep going."""
    new_obs, _ = _reset(env, seeds, _mask(env.num_envs, slots))
    policy.reset(env_ids=torch.as_tensor(slots))
    return new_obs
