"""Build gymnasium vector envs from an `EnvConfig`, sync or async."""

from __future__ import annotations

import functools
import importlib
import multiprocessing
import os
import time

import gymnasium as gym
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv

from lerobot.config import ConfigError, EnvConfig

# spawn/forkserver never fork a parent that already runs torch's thread pools (fork can deadlock there).
_START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"

# Above this single-env step cost, async workers win on this many cores (see docs/benchmarks.md).
ASYNC_MIN_STEP_MS = 1.0


def _make_single_env(gym_id: str, max_episode_steps: int, gym_kwargs: dict, render_mode: str | None):
    """Create one env; runs inside async workers too, so it imports the env's package itself."""
    namespace = gym_id.split("/")[0] if "/" in gym_id else None
    if namespace is not None:
        # Registering the namespace (e.g. `gym_pusht`) is a side effect of importing its package.
        importlib.import_module(namespace)
    kwargs = dict(gym_kwargs)
    if render_mode is not None:
        kwargs["render_mode"] = render_mode
    return gym.make(gym_id, max_episode_steps=max_episode_steps, disable_env_checker=True, **kwargs)


def make_env(
    env_cfg: EnvConfig,
    n_envs: int,
    use_async: bool = False,
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    render_mode: str | None = "rgb_array",
    copy: bool = True,
) -> VectorEnv:
    """Return a vector env of `n_envs` copies of `env_cfg.gym_id` with the config's time limit.

    Args:
        env_cfg: the env section of the config (gym id, kwargs, `max_episode_steps`).
        n_envs: number of parallel envs (>= 1).
        use_async: one worker process per env (AsyncVectorEnv) instead of stepping them in this process.
        autoreset_mode: gymnasium's autoreset mode; `eval_policy` handles all three.
        render_mode: passed to every env so that `render()` works for videos.
        copy: return fresh observation arrays each step. `False` returns the vector env's own buffers
            (overwritten by the next step), saving one copy of every image per step; safe when each
            observation is consumed before the next step, as `eval_policy` does.
    """
    if n_envs < 1:
        raise ConfigError(f"n_envs={n_envs} must be >= 1")
    namespace = env_cfg.gym_id.split("/")[0] if "/" in env_cfg.gym_id else None
    if namespace is not None:
        try:
            importlib.import_module(namespace)
        except ImportError:
            raise ConfigError(
                f"env {env_cfg.name!r} needs the package {namespace!r}: pip install {namespace.replace('_', '-')}"
            ) from None
    if env_cfg.gym_id not in gym.registry:
        raise ConfigError(f"unknown gym id {env_cfg.gym_id!r} in env {env_cfg.name!r}")
    fn = functools.partial(
        _make_single_env, env_cfg.gym_id, env_cfg.max_episode_steps, dict(env_cfg.gym_kwargs), render_mode
    )
    fns = [fn] * n_envs
    if use_async:
        return AsyncVectorEnv(fns, context=_START_METHOD, autoreset_mode=autoreset_mode, copy=copy)
    return SyncVectorEnv(fns, autoreset_mode=autoreset_mode, copy=copy)


@functools.cache
def measure_step_ms(env_cfg_key: tuple, n_steps: int = 50) -> float:
    """Median wall time (ms) of one single-env step with random actions, rendering included."""
    gym_id, max_steps, kwargs = env_cfg_key
    env = _make_single_env(gym_id, max_steps, dict(kwargs), "rgb_array")
    env.reset(seed=0)
    times = []
    for _ in range(n_steps):
        t0 = time.perf_counter()
        _, _, term, trunc, _ = env.step(env.action_space.sample())
        times.append(time.perf_counter() - t0)
        if term or trunc:
            env.reset()
    env.close()
    times.sort()
    return 1e3 * times[len(times) // 2]


def resolve_use_async(setting: str | bool, env_cfg: EnvConfig, n_envs: int) -> bool:
    """Turn `eval.use_async_envs` (true/false/auto) into a decision.

    `auto` goes async only when there is more than one env and more than one core, and one env step costs
    more than `ASYNC_MIN_STEP_MS`: below that, inter-process traffic costs more than the physics saves.
    """
    value = str(setting).lower()
    if value in ("true", "false"):
        return value == "true"
    if n_envs < 2 or (os.cpu_count() or 1) < 2:
        return False
    key = (env_cfg.gym_id, env_cfg.max_episode_steps, tuple(sorted(dict(env_cfg.gym_kwargs).items())))
    return measure_step_ms(key) > ASYNC_MIN_STEP_MS
