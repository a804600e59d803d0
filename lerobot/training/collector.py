"""The online trainer's collector: the train envs, stepped with random or exploring actions, their transitions
written into the replay buffer.

Autoreset: the train envs use `AutoresetMode.SAME_STEP`, so every vector step is a real transition for every env;
the replay buffer stores `info["final_obs"]` as the next observation of an episode's last step.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from gymnasium.vector import AsyncVectorEnv, AutoresetMode

from lerobot.config import EnvConfig
from lerobot.envs import close_now, make_env, observation_to_batch
from lerobot.envs.faults import Watchdog
from lerobot.errors import EnvWorkerError
from lerobot.policies.online_policy import OnlinePolicy
from lerobot.rollout import ASYNC_RESET_TIMEOUT_S, act, reset_envs, step_envs
from lerobot.runtime import signals
from lerobot.runtime.signals import WaitInterrupted
from lerobot.training.online_state import Counts
from lerobot.training.replay_buffer import ReplayBuffer
from lerobot.training.schedule import UpdateSchedule


class _EpisodeStats:
    """Returns and lengths of the episodes the train envs finish."""

    def __init__(self, n_envs: int):
        self.ret = np.zeros(n_envs)
        self.len = np.zeros(n_envs, dtype=np.int64)
        self.finished_returns: list[float] = []
        self.finished_lengths: list[int] = []

    def step(self, reward: np.ndarray, done: np.ndarray) -> None:
        self.ret += reward
        self.len += 1
        for i in np.flatnonzero(done):
            self.finished_returns.append(float(self.ret[i]))
            self.finished_lengths.append(int(self.len[i]))
        self.ret[done] = 0.0
        self.len[done] = 0

    def pop(self) -> dict[str, float]:
        if not self.finished_returns:
            return {}
        out = {
            "episode_return": float(np.mean(self.finished_returns)),
            "episode_length": float(np.mean(self.finished_lengths)),
            "episodes_finished": float(len(self.finished_returns)),
        }
        self.finished_returns, self.finished_lengths = [], []
        return out


class Collector:
    """The train envs and their current observations: steps them and stores the transitions in `buffer`.

    The envs autoreset in the same step (`AutoresetMode.SAME_STEP`), so every vector step is a real transition
    for every env. Actions are uniform random while `schedule.random_actions` says so, the policy's (with
    `explore` on, through the acting step `lerobot.rollout.act`) afterwards; a NaN or infinite one stops
    the run before it reaches an env (it would poison the env's state and the replay buffer). `episodes`
    gathers the returns and lengths of the episodes the envs finish.

    Async envs wait at most `step_timeout_s` for a step (a watchdog enforces it; None: no limit, resets then
    wait `ASYNC_RESET_TIMEOUT_S`): a worker that dies or does not answer raises `EnvWorkerError` naming it,
    and a stop signal abandons the wait (`WaitInterrupted`). Either way the workers are killed at once, and
    the envs are not used again.
    """

    # What the message of a non-finite action advises.
    NON_FINITE_ADVICE = (
        "The policy diverged: resume from an earlier checkpoint with a lower policy.optimizer_lr"
    )

    def __init__(
        self,
        env_cfg: EnvConfig,
        n_envs: int,
        use_async: bool,
        policy: OnlinePolicy,
        buffer: ReplayBuffer,
        schedule: UpdateSchedule,
        device: torch.device,
        step_timeout_s: float | None = None,
    ):
        self.envs = make_env(
            env_cfg, n_envs, use_async=use_async, autoreset_mode=AutoresetMode.SAME_STEP, render_mode=None
        )
        self.n_envs = n_envs
        self.policy = policy
        self.buffer = buffer
        self.schedule = schedule
        self.device = device
        self.step_timeout_s = step_timeout_s
        self.reset_timeout_s = ASYNC_RESET_TIMEOUT_S if step_timeout_s is None else step_timeout_s
        self.watchdog = Watchdog(self.envs) if isinstance(self.envs, AsyncVectorEnv) else None
        self.obs: dict[str, np.ndarray] = {}
        self.episodes = _EpisodeStats(n_envs)

    def _wait(self, call: Callable[..., Any], *args: Any) -> Any:
        """`call(self.envs, *args)` (`step_envs`, `reset_envs`). On async envs a stop signal abandons the wait
        (`WaitInterrupted`): a stopped or hung worker would keep the run from stopping. A sync env's call
        runs env code in this process, which a signal must not cut (`lerobot.envs.faults.ENV_CALLS`), and
        ends within the step's time."""
        if self.watchdog is None:
            return call(self.envs, *args)
        stop = signals.active()
        try:
            with stop.waiting() if stop is not None else contextlib.nullcontext():
                return call(self.envs, *args)
        except (WaitInterrupted, EnvWorkerError):
            close_now(self.envs)  # workers halfway through a call, or dead, or stopped: never waited on
            raise

    def start(self, seed: int) -> None:
        """Start fresh episodes in every env: env `i` is reset with `seed + i`; actions and noise are reseeded."""
        self.envs.action_space.seed(seed)
        seeds = [seed + i for i in range(self.n_envs)]
        self.obs, _ = self._wait(reset_envs, seeds, None, self.reset_timeout_s, self.watchdog)
        self.buffer.start_episodes()  # a resumed buffer's last episodes end where they were cut
        self.reset_policy(seed)

    def reset_policy(self, seed: int) -> None:
        """Clear the policy's per-env state (history, warm-started plans) and reseed its exploration noise."""
        self.policy.reset()
        self.policy.set_noise_seed(seed)

    def collect(self, counts: Counts, stop_requested: Callable[[], bool]) -> None:
        """Take the vector steps left of the collection under way (`train_freq` less
        `counts.collection_steps`), each counted in `counts` once its transitions are stored, until
        `stop_requested()` says otherwise at a step boundary."""

        def describe_slot(slot: int) -> str:  # read when an action is refused: the count at that step
            return f"train env slot {slot} after {counts.transitions} transitions"

        self.policy.eval()
        self.policy.explore = True
        try:
            while counts.collection_steps < self.schedule.train_freq and not stop_requested():
                self.policy.set_progress(counts.transitions)
                if self.schedule.random_actions(counts.transitions):
                    action = self.envs.action_space.sample()
                else:
                    action = act(self.policy, self.obs, self.device, describe_slot, self.NON_FINITE_ADVICE)
                step_result = self._wait(step_envs, action, self.step_timeout_s, self.watchdog)
                next_obs, reward, terminated, truncated, info = step_result
                self.buffer.add_env_step(
                    self.obs, action, step_result, AutoresetMode.SAME_STEP, to_batch=observation_to_batch
                )
                done = np.logical_or(terminated, truncated)
                self.episodes.step(np.asarray(reward, dtype=np.float64), done)
                if done.any():
                    # New episodes start in these slots: no history or warm-started plan from the old ones.
                    self.policy.reset(np.flatnonzero(done))
                self.obs = next_obs
                counts.transitions += self.n_envs
                counts.collection_steps += 1
        finally:
            self.policy.explore = False  # evaluation and checkpoints never see exploration on

    def close(self) -> None:
        """Close the train envs (at once where a call to their workers was cut short, `close_now`)."""
        if self.watchdog is not None:
            self.watchdog.close()
        self.envs.close()
