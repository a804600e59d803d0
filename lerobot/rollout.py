"""Batched evaluation: run a `Policy` in a gymnasium vector env and count every episode exactly.

One acting step, `act`, serves evaluation and the online trainer's data collection alike:
env observation -> `observation_to_batch` -> `policy.select_action` -> a finite (B, action_dim) action.
`eval_policy` is a loop around it: act, step the env, count, reset the slots whose episodes ended. Its
videos are written by `lerobot.episode_videos`, its figures aggregated by `lerobot.episode_stats`.

Exactness rules:
- Episode i is reset with seed `start_seed + i`, whichever slot (env index) runs it, so per-episode results
  do not depend on `num_envs` or on sync vs async. A multi-task evaluation runs a plan of (task, seed)
  episodes (`lerobot.envs.tasks.episode_plan`); each is reset with a seed that names both
  (`EpisodeSpec.reset_seed`), and the policy's random stream is keyed by that seed, so an episode's results
  depend on its task and seed alone. Env slots, not tasks, set the memory: a slot runs any task.
- An episode's figures count its steps up to and including its first done (terminated or truncated) step.
  The moment an episode ends its slot is reset explicitly (`reset_mask`; with an idle seed while it waits
  for its next episode), and when its next episode starts the slot is reset with that episode's seed and
  the policy's history and action queue for that slot are cleared, so nothing from gymnasium's autoreset
  and no queued action of an earlier episode reaches a new one. This works for every autoreset mode.
- Scheduling (one small class per name of `EVAL_SCHEDULES`, in `lerobot.episode_schedules`, says when the slots waiting
  for their next episode begin it): with `schedule="refill"` a slot starts the next pending episode as
  soon as its episode ends; with `schedule="refill_aligned"` (default) it starts it at the next step where
  the other slots get new action chunks (at most `n_action_steps - 1` idle steps; at once when no other
  slot is running), so one batched chunk prediction keeps serving all slots instead of one per chunk phase
  (plain refill spreads the slots over every phase, see docs/evaluation.md); `schedule="batch"` waits
  until every slot is done (fixed batches of `num_envs`).
  All give identical per-episode results for a deterministic policy.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, SyncVectorEnv, VectorEnv
from tqdm.auto import tqdm

from lerobot.constants import EVAL_SCHEDULES
from lerobot.envs.faults import ENV_CALLS, Watchdog, close_now, interrupts_after_env_calls, worker_call
from lerobot.envs.observation import observation_to_batch
from lerobot.envs.tasks import EpisodeSpec, episode_plan, task_seed
from lerobot.episode_schedules import SCHEDULES
from lerobot.episode_stats import aggregate_episodes
from lerobot.episode_videos import EpisodeVideos
from lerobot.errors import EnvWorkerError, NonFiniteActionError
from lerobot.policies.policy import Policy

if TYPE_CHECKING:
    from lerobot.datasets.recording import EpisodeRecorder

# A reset (or render) that takes longer than this means a worker hangs; fail instead of waiting forever.
# Steps wait without a timeout unless `eval_policy(step_timeout_s=...)` asks for one (which then bounds
# resets and renders too; `eval.step_timeout_s` asks for 120 s by default). The env's watchdog thread
# enforces every one of these timeouts, at no cost per call (docs/evaluation.md).
ASYNC_RESET_TIMEOUT_S = 120.0
_SLOW_HINT = "; if it is only slow, raise eval.step_timeout_s"

# What the message of a non-finite action advises during evaluation.
_EVAL_ADVICE = "Check the checkpoint (a diverged run?) and its normalization stats"

_NO_SLOTS = np.zeros(0, dtype=np.int64)


def policy_device(policy: torch.nn.Module) -> torch.device:
    """The device of the policy's parameters or buffers (CPU for a policy with neither)."""
    for tensor in (*policy.parameters(), *policy.buffers()):
        return tensor.device
    return torch.device("cpu")


def act(
    policy: Policy,
    obs: Mapping[str, np.ndarray],
    device: torch.device,
    describe_slot: Callable[[int], str],
    advice: str,
) -> np.ndarray:
    """One finite action per env slot, (B, action_dim), for the vector env observation `obs` {key: (B, ...)}.

    `obs` is converted (`observation_to_batch`, onto `device`) only when the policy reads it: a policy that
    keeps no history (`n_obs_steps == 1`) reads none between its chunks (`steps_until_chunk() > 0`), the
    rule under which `Policy.select_action` takes None.
    A NaN or infinite action never reaches the env: the policy refuses it when it predicts it (each chunk is
    checked once, when it is queued), and `act` raises `NonFiniteActionError` naming the first such slot as
    the caller's `describe_slot(slot)` puts it (e.g. "env slot 1, episode 1 (seed 101) at its step 5"),
    ending with `advice`, what to do about it.
    """
    needs_obs = policy.n_obs_steps > 1 or policy.steps_until_chunk() == 0
    try:
        return policy.select_action_numpy(observation_to_batch(obs, device) if needs_obs else None)
    except NonFiniteActionError as e:
        if e.slot is None:
            raise
        n = e.steps_ahead
        ahead = f" (in the chunk predicted then, {n} step{'s' if n > 1 else ''} ahead)" if n else ""
        raise NonFiniteActionError(
            f"the policy returned a non-finite action {e.action} for {describe_slot(e.slot)}{ahead}; "
            f"it was not sent to the env. {advice}",
            e.slot,
            e.steps_ahead,
            e.action,
        ) from None


def step_envs(env: VectorEnv, action: np.ndarray, timeout_s: float | None, watchdog: Watchdog | None):
    """`env.step(action)`; an async env's dead worker, or one silent for `timeout_s` (enforced by `watchdog`;
    None: no limit), raises `EnvWorkerError` naming it. Evaluation and the online trainer's collection alike."""
    if not isinstance(env, AsyncVectorEnv):
        with ENV_CALLS:  # a Ctrl-C inside it is raised after it (`ENV_CALLS`)
            return env.step(action)
    # The watchdog alone enforces the timeout: gymnasium's would poll every pipe at every step.
    polled = watchdog is None
    with worker_call(env, "step", timeout_s, _SLOW_HINT, watchdog, polled=polled):
        env.step_async(action)
        return env.step_wait(timeout=timeout_s if polled else None)


def reset_envs(
    env: VectorEnv,
    seeds: list[int | None],
    mask: np.ndarray | None,
    timeout_s: float,
    watchdog: Watchdog | None,
):
    """`env.reset(seed=seeds)` of the slots in `mask` (None: all), with the faults of `step_envs` turned
    into `EnvWorkerError` as there (`timeout_s` always applies)."""
    options = None if mask is None else {"reset_mask": mask}
    if not isinstance(env, AsyncVectorEnv):
        with ENV_CALLS:
            return env.reset(seed=seeds, options=options)
    polled = watchdog is None  # as for a step
    with worker_call(env, "reset", timeout_s, _SLOW_HINT, watchdog, polled=polled):
        env.reset_async(seed=seeds, options=options)
        return env.reset_wait(timeout=timeout_s if polled else None)


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


def _render(
    env: VectorEnv, slots: list[int], timeout_s: float, watchdog: Watchdog | None
) -> list[np.ndarray]:
    """RGB frames of `slots`; a sync env renders only those, an async one renders in its workers."""
    if isinstance(env, SyncVectorEnv):
        with ENV_CALLS:
            return [env.envs[s].render() for s in slots]
    polled = watchdog is None  # as for a step
    with worker_call(env, "render", timeout_s, _SLOW_HINT, watchdog, polled=polled):
        env.call_async("render")
        images = env.call_wait(timeout=timeout_s if polled else None)
    return [images[s] for s in slots]


class _Episodes:
    """Which episode each env slot runs, the running figures of those episodes, and the finished results.

    Episode i is `plan[i]`, reset with its `reset_seed`. Slots with no episode to run are idle: they still
    step (a vector env steps all of its envs), with seeds past the evaluated range (of the task they ran
    last, so that a multi-task env keeps its model), and their figures are discarded.
    """

    def __init__(self, plan: list[EpisodeSpec], num_envs: int):
        self.plan, self.n_episodes, self.num_envs = plan, len(plan), num_envs
        self.next_episode = 0  # the next episode to start
        self.n_active = 0  # slots running an episode
        self.vector_steps = 0  # vector steps taken
        self.busy_steps = 0  # env steps that belonged to an evaluated episode
        self.idle_seed = max(spec.seed for spec in plan) + 1
        self.slot_episode = np.full(num_envs, -1, dtype=np.int64)  # -1 = idle
        self.slot_position = np.zeros(num_envs, dtype=np.int64)  # task position of the slot's last episode
        self.slot_start = np.zeros(num_envs, dtype=np.int64)  # vector step at which the episode began
        # Every vector step's (B,) rewards and successes since the oldest running episode began (vector
        # step `first_kept`): a step only appends them, an episode's figures are computed once, at its end.
        self.rewards: list[np.ndarray] = []
        self.successes: list[np.ndarray] = []
        self.first_kept = 0
        self.sum_reward = np.zeros(self.n_episodes)
        self.max_reward = np.full(self.n_episodes, -np.inf)
        self.success = np.zeros(self.n_episodes, dtype=bool)
        self.n_steps = np.zeros(self.n_episodes, dtype=np.int64)

    @property
    def all_started(self) -> bool:
        """Whether every episode has been given to a slot."""
        return self.next_episode == self.n_episodes

    @property
    def done(self) -> bool:
        """Whether every episode has ended."""
        return self.all_started and self.n_active == 0

    def start(self, slots: np.ndarray) -> list[int | None]:
        """Give `slots` the next pending episodes (idle once none is left); return per-env reset seeds."""
        seeds: list[int | None] = [None] * self.num_envs
        for slot in slots:
            if self.next_episode < self.n_episodes:
                spec = self.plan[self.next_episode]
                self.slot_episode[slot] = self.next_episode
                self.slot_position[slot] = spec.position
                seeds[slot] = spec.reset_seed
                self.next_episode += 1
            else:
                self.slot_episode[slot] = -1
                seeds[slot] = self._take_idle_seed(slot)
        self.n_active = int(np.count_nonzero(self.slot_episode >= 0))
        self.slot_start[slots] = self.vector_steps
        return seeds

    def idle_seeds(self, slots: np.ndarray) -> list[int | None]:
        """Per-env reset seeds that keep `slots` idle."""
        seeds: list[int | None] = [None] * self.num_envs
        for slot in slots:
            seeds[slot] = self._take_idle_seed(slot)
        return seeds

    def _take_idle_seed(self, slot: int) -> int:
        self.idle_seed += 1
        return task_seed(int(self.slot_position[slot]), self.idle_seed - 1)

    def log_step(self, reward: np.ndarray, success: np.ndarray) -> None:
        """Count one vector step and keep its (B,) rewards and successes (new arrays, as a vector env returns)."""
        self.vector_steps += 1
        self.busy_steps += self.n_active
        self.rewards.append(reward)
        self.successes.append(success)

    def finish(self, slots: np.ndarray) -> np.ndarray:
        """Record the episodes that `slots` ended at the step just taken; return their indices."""
        episodes = self.slot_episode[slots]
        first = int(self.slot_start[slots].min())
        rewards = np.stack(self.rewards[first - self.first_kept :])  # (T, B) from the oldest of their starts
        successes = np.stack(self.successes[first - self.first_kept :])
        for slot, episode, start in zip(slots.tolist(), episodes.tolist(), self.slot_start[slots].tolist()):
            own = rewards[start - first :, slot]
            # A cumulative sum adds step by step in episode order: a plain single-env loop's float result.
            self.sum_reward[episode] = np.cumsum(own, dtype=np.float64)[-1]
            self.max_reward[episode] = own.max()
            self.success[episode] = successes[start - first :, slot].any()
        self.n_steps[episodes] = self.vector_steps - self.slot_start[slots]
        self.slot_episode[slots] = -1
        self.n_active -= len(slots)
        running = self.slot_episode >= 0
        oldest = int(self.slot_start[running].min()) if running.any() else self.vector_steps
        del self.rewards[: oldest - self.first_kept], self.successes[: oldest - self.first_kept]
        self.first_kept = oldest
        return episodes

    def running(self) -> tuple[np.ndarray, list[tuple[int, EpisodeSpec]]]:
        """The slots that run an episode, and (episode index, its spec) of each."""
        slots = np.flatnonzero(self.slot_episode >= 0)
        return slots, [(int(e), self.plan[e]) for e in self.slot_episode[slots]]

    def describe_slot(self, slot: int) -> str:
        """`slot` and what it runs at the step about to be taken, for error messages."""
        episode = int(self.slot_episode[slot])
        if episode < 0:
            return f"env slot {slot}, an idle slot at vector step {self.vector_steps + 1}"
        step = self.vector_steps - self.slot_start[slot] + 1
        spec = self.plan[episode]
        task = "" if spec.task is None else f"task {spec.task}, "
        return f"env slot {slot}, episode {episode} ({task}seed {spec.seed}) at its step {step}"

    def results(self, eval_s: float, video_paths: list[str], video_error: OSError | None) -> dict[str, Any]:
        """What `eval_policy` returns, once every episode has ended `eval_s` seconds after the start."""
        per_episode = self.per_episode()
        slot_steps = self.vector_steps * self.num_envs
        aggregated = aggregate_episodes(per_episode, eval_s, self.busy_steps, slot_steps)
        result = {"per_episode": per_episode, "aggregated": aggregated, "video_paths": video_paths}
        if video_error is not None:
            result["video_error"] = video_error
        return result

    def per_episode(self) -> list[dict[str, Any]]:
        """One row per episode, in episode order."""
        rows = []
        for i, spec in enumerate(self.plan):
            row = {"episode_ix": i} if spec.task is None else {"episode_ix": i, "task": spec.task}
            rows.append(
                {
                    **row,
                    "seed": spec.seed,
                    "sum_reward": float(self.sum_reward[i]),
                    "max_reward": float(self.max_reward[i]),
                    "success": bool(self.success[i]),
                    "n_steps": int(self.n_steps[i]),
                }
            )
        return rows


class _Rollout:
    """The episodes of one `eval_policy` call run in `env`: what its steps and resets share.

    Each vector step acts, steps every slot and counts the step; the slots whose episodes ended then begin
    their next ones, or idle until the `schedule` lets them (see the module docstring).
    """

    def __init__(
        self,
        env: VectorEnv,
        policy: Policy,
        episodes: _Episodes,
        videos: EpisodeVideos,
        recorder: EpisodeRecorder | None,
        begin_now: Callable[[_Episodes, Policy], bool],
        step_timeout_s: float | None,
        call_timeout_s: float,
        watchdog: Watchdog | None,
    ):
        self.env, self.policy, self.device = env, policy, policy_device(policy)
        self.episodes, self.videos, self.recorder, self.begin_now = episodes, videos, recorder, begin_now
        self.step_timeout_s, self.call_timeout_s, self.watchdog = step_timeout_s, call_timeout_s, watchdog

    def run(self, bar: tqdm) -> None:
        """Run every episode of the plan from the first reset on, ticking `bar` as episodes end."""
        episodes = self.episodes
        obs = self.reset(np.arange(self.env.num_envs))
        waiting = _NO_SLOTS  # slots whose episode ended, idle until the schedule lets them begin the next
        while not episodes.done:
            if waiting.size and self.begin_now(episodes, self.policy):
                obs, waiting = self.reset(waiting), _NO_SLOTS
            obs, done = self.step(obs)
            if not done.any():
                continue
            ended = np.flatnonzero(done)
            # Idle slots step too, and their filler episodes end as well: with autoreset disabled such a
            # slot cannot step again before a reset, so every ended slot is reset below.
            finished = ended[episodes.slot_episode[ended] >= 0]
            if finished.size:
                if self.recorder is not None:
                    self.recorder.finish(finished)
                self.videos.finish(episodes.finish(finished))
                bar.update(finished.size)
                if episodes.done:
                    break
            if finished.size and self.begin_now(episodes, self.policy):
                begin = np.union1d(finished, waiting)
                obs, waiting = self.reset(begin, np.setdiff1d(ended, begin)), _NO_SLOTS
            else:  # idle until the schedule lets them begin (with no episode left: for good)
                obs = self.reset(_NO_SLOTS, ended)
                if not episodes.all_started:
                    waiting = np.union1d(waiting, finished)

    def step(self, obs: Any) -> tuple[Any, np.ndarray]:
        """Act on `obs`, step every slot and count the step (recorder and videos too); return the new
        observation and the (B,) done flags of the step."""
        episodes, recorder = self.episodes, self.recorder
        action = act(self.policy, obs, self.device, episodes.describe_slot, _EVAL_ADVICE)
        if recorder is not None:
            recorder.observe(*episodes.running(), obs, action)
        obs, reward, terminated, truncated, info = step_envs(
            self.env, action, self.step_timeout_s, self.watchdog
        )
        success, done = _success(info, self.env.num_envs), terminated | truncated
        episodes.log_step(reward, success)
        if recorder is not None:
            recorder.outcome(reward, success, done)
        if self.videos.frames:
            self.videos.capture(episodes.slot_episode, np.flatnonzero(episodes.slot_episode >= 0))
        return obs, done

    def reset(self, begin: np.ndarray, idle: np.ndarray = _NO_SLOTS) -> Any:
        """One env reset: `begin` slots start their next episodes (fresh policy state, recording), `idle`
        slots filler episodes; return the new observation.

        An idle slot keeps its policy state, so its queue keeps the other slots' chunk phase.
        """
        env, episodes = self.env, self.episodes
        seeds = episodes.start(begin)
        for slot, seed in enumerate(episodes.idle_seeds(idle)):
            if seed is not None:
                seeds[slot] = seed
        slots = np.union1d(begin, idle)
        mask = None if slots.size == env.num_envs else _mask(env.num_envs, slots)
        obs, _ = reset_envs(env, seeds, mask, self.call_timeout_s, self.watchdog)
        if begin.size:
            self.policy.reset(begin, episode_seeds=[seeds[slot] for slot in begin])
            self.videos.start(episodes.slot_episode, begin)
        return obs


def _checked_plan(
    n_episodes: int, start_seed: int, plan: list[EpisodeSpec] | None, schedule: str
) -> list[EpisodeSpec]:
    """The episodes `eval_policy` runs (`plan`, else `n_episodes` seeded from `start_seed`), once its
    arguments are checked."""
    if n_episodes <= 0:
        raise ValueError(f"n_episodes={n_episodes} must be > 0")
    if plan is None:
        plan = episode_plan(n_episodes, start_seed)
    elif len(plan) != n_episodes:
        raise ValueError(f"a plan of {len(plan)} episodes for n_episodes={n_episodes}")
    if schedule not in EVAL_SCHEDULES:
        raise ValueError(f"schedule={schedule!r}: expected one of {EVAL_SCHEDULES}")
    return plan


@torch.no_grad()
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
    recorder: EpisodeRecorder | None = None,
    plan: list[EpisodeSpec] | None = None,
) -> dict[str, Any]:
    """Evaluate `policy` for `n_episodes` on the vector env `env` and return per-episode and aggregate metrics.

    The episodes are `plan` when given (a multi-task evaluation: each with its task and seed, see
    `lerobot.envs.tasks`; `n_episodes` must be its length), else `n_episodes` with seeds `start_seed + i`.
    Multi-task rows carry their `task`, and `aggregated["per_task"]` the figures of each task.

    Returns `{"per_episode": [{"episode_ix", "seed", "sum_reward", "max_reward", "success", "n_steps"}],
    "aggregated": {"avg_sum_reward", "avg_max_reward", "pc_success", their 95% intervals
    ("avg_max_reward_ci95_low/high", "pc_success_ci95_low/high", Wilson's for success), "n_episodes",
    "eval_s", "eval_ep_s", "env_steps", "env_steps_per_s", "slot_utilization"}, "video_paths": [...]}` with
    episodes ordered by index, and `"video_error"` (the `OSError`) when a full disk stopped a video: that
    video is not written, the others and the figures are.
    `slot_utilization` is busy env-steps / total env-steps (idle slots waiting for others count as waste).
    With an `AsyncVectorEnv`, a dead worker raises `EnvWorkerError` at once; a hung one does so after
    `step_timeout_s` if given (enforced by a watchdog thread; resets and renders wait at most
    `step_timeout_s`, else `ASYNC_RESET_TIMEOUT_S`). On such an error, and on Ctrl-C, every worker of `env`
    is killed and `env` is closed (`close_now`), so no call waits on a worker that will never answer.
    A NaN or infinite action raises `NonFiniteActionError` naming the env slot, episode and step; it is
    never sent to the env. Works with every gymnasium autoreset mode. A `recorder` gets every step of every
    episode (the observation acted on, the action, what the step returned) and each episode's end.
    """
    plan = _checked_plan(n_episodes, start_seed, plan, schedule)
    policy.eval()
    policy.reset()
    episodes = _Episodes(plan, env.num_envs)
    call_timeout_s = ASYNC_RESET_TIMEOUT_S if step_timeout_s is None else step_timeout_s
    watchdog = Watchdog(env) if isinstance(env, AsyncVectorEnv) else None
    render = functools.partial(_render, env, timeout_s=call_timeout_s, watchdog=watchdog)
    videos = EpisodeVideos(env, videos_dir, max_episodes_rendered, render)
    begin_now = SCHEDULES[schedule].begin_now
    rollout = _Rollout(
        env, policy, episodes, videos, recorder, begin_now, step_timeout_s, call_timeout_s, watchdog
    )
    start_time = time.perf_counter()
    bar = tqdm(total=n_episodes, desc="eval episodes", disable=not progress, leave=False)
    restore_interrupts = interrupts_after_env_calls()
    try:
        rollout.run(bar)
    except (EnvWorkerError, KeyboardInterrupt):
        # A dead, stopped or interrupted worker never answers gymnasium's close(), which would wait on it
        # forever (and keep a Ctrl-C from ending the program): kill the workers now.
        close_now(env)
        videos.abort()
        raise
    except BaseException:
        videos.abort()
        raise
    finally:
        restore_interrupts()
        bar.close()
        if watchdog is not None:
            watchdog.close()
    video_paths, video_error = videos.close()
    return episodes.results(time.perf_counter() - start_time, video_paths, video_error)


def _mask(num_envs: int, slots: np.ndarray) -> np.ndarray:
    mask = np.zeros(num_envs, dtype=bool)
    mask[slots] = True
    return mask
