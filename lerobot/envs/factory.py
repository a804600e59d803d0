"""Build gymnasium vector envs from an `EnvConfig`, sync or async."""

from __future__ import annotations

import contextlib
import functools
import importlib
import json
import logging
import multiprocessing
import os
import threading
import time
from pathlib import Path

import gymnasium as gym
import numpy as np
from gymnasium import spaces
from gymnasium.envs.registration import load_env_creator
from gymnasium.vector import AsyncVectorEnv, AutoresetMode, SyncVectorEnv, VectorEnv
from gymnasium.vector.async_vector_env import AsyncState
from omegaconf import OmegaConf

from lerobot.config import EnvConfig
from lerobot.constants import VISUAL
from lerobot.envs.faults import close_now, kill_workers, worker_call
from lerobot.envs.worker import build_env, build_worker_env, env_module, registered_id
from lerobot.errors import ConfigError, EnvWorkerError
from lerobot.runtime.files import write_json

log = logging.getLogger(__name__)

# spawn/forkserver never fork a parent that already runs torch's thread pools (fork can deadlock there).
_START_METHOD = "forkserver" if "forkserver" in multiprocessing.get_all_start_methods() else "spawn"


# A worker that has not built its env after this long is stuck (importing the env's package and building it
# takes seconds, even with dozens of workers sharing two cores).
ASYNC_START_TIMEOUT_S = 120.0


class _AsyncVectorEnv(AsyncVectorEnv):
    """An `AsyncVectorEnv` that never waits on a worker that cannot answer.

    A worker that dies while the env starts raises `EnvWorkerError` naming it (gymnasium: a bare
    `ConnectionResetError`), and `close()` kills the workers instead of waiting on them when one is dead
    or a call is still pending (after a timeout or Ctrl-C), where gymnasium's `close()` would hang.
    """

    def _check_spaces(self) -> None:
        # gymnasium's first exchange with the new workers, at the end of __init__. It waits on them without
        # a timeout, so a watchdog kills the workers still silent after ASYNC_START_TIMEOUT_S, which turns
        # that wait into a broken pipe.
        silent: list[int] = []

        def kill_silent() -> None:
            silent.extend(
                i for i, pipe in enumerate(self.parent_pipes) if pipe is not None and not pipe.poll(0)
            )
            for i in silent:
                self.processes[i].kill()

        watchdog = threading.Timer(ASYNC_START_TIMEOUT_S, kill_silent)
        watchdog.daemon = True
        watchdog.start()
        try:
            with worker_call(self, "start-up", ASYNC_START_TIMEOUT_S):
                super()._check_spaces()
        except EnvWorkerError:
            close_now(self)
            if not silent:
                raise
            who = ", ".join(f"env worker {i} (pid {self.processes[i].pid})" for i in silent)
            raise EnvWorkerError(
                f"{who} of {self.num_envs} did not answer its start-up within {ASYNC_START_TIMEOUT_S:.0f} s "
                "(stopped or stuck)"
            ) from None
        except BaseException:
            close_now(self)
            raise
        finally:
            watchdog.cancel()

    def close_extras(self, timeout: float | None = None, terminate: bool = False) -> None:
        """Close the workers: politely when all are alive and idle, else by SIGKILL (see `kill_workers`)."""
        if terminate or self._state != AsyncState.DEFAULT or not all(p.is_alive() for p in self.processes):
            kill_workers(self)
        else:
            super().close_extras(timeout=timeout)


def make_single_env(env_cfg: EnvConfig, render_mode: str | None = None) -> gym.Env:
    """One env of `env_cfg` (time limit, observations keyed by batch keys), outside any vector env."""
    _check_env_config(env_cfg)
    return build_env(
        env_cfg.gym_id,
        env_cfg.max_episode_steps,
        _gym_kwargs(env_cfg),
        render_mode,
        dict(env_cfg.observation_keys),
    )


def _gym_kwargs(env_cfg: EnvConfig) -> dict:
    """The keyword arguments of the env: `env.gym_kwargs`, plus `task` for a multi-task env."""
    kwargs = dict(env_cfg.gym_kwargs)
    if env_cfg.task is not None:
        kwargs["task"] = env_cfg.task if isinstance(env_cfg.task, str) else [str(t) for t in env_cfg.task]
    return kwargs


def env_task_names(env_cfg: EnvConfig) -> list[str] | None:
    """The tasks that `env.task` names, as the env's class resolves them (its `task_names(task)`), in the order
    evaluation runs them; None for a single-task env (`env.task` null)."""
    if env_cfg.task is None:
        return None
    _check_env_config(env_cfg)
    entry_point = gym.spec(registered_id(env_cfg.gym_id)).entry_point
    env_class = load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point
    resolve = getattr(env_class, "task_names", None)
    if resolve is None:
        raise ConfigError(
            f"env.task={env_cfg.task!r}: env {env_cfg.name!r} runs one task; remove env.task (or use a "
            "multi-task env such as env=metaworld)"
        )
    return list(resolve(_gym_kwargs(env_cfg)["task"]))


def _check_env_config(env_cfg: EnvConfig) -> None:
    """The env's package is installed, its gym id registered and its observation mapping given."""
    if not env_cfg.observation_keys:
        raise ConfigError(
            f"env {env_cfg.name!r} has no env.observation_keys: map the env's observation paths to batch "
            "keys, e.g. `observation_keys: {agent_pos: observation.state}`"
        )
    namespace = env_module(env_cfg.gym_id)
    if namespace is not None:
        try:
            importlib.import_module(namespace)
        except ImportError:
            raise ConfigError(
                f"env {env_cfg.name!r} needs the package {namespace!r}: pip install {namespace.replace('_', '-')}"
            ) from None
    if registered_id(env_cfg.gym_id) not in gym.registry:
        raise ConfigError(f"unknown gym id {env_cfg.gym_id!r} in env {env_cfg.name!r}")


def _check_shapes(env_cfg: EnvConfig, space: spaces.Dict) -> None:
    """The env's observations have the shapes `env.features` declares (images declared channels-first)."""
    path_of = {key: path for path, key in env_cfg.observation_keys.items()}
    for key, sub in space.spaces.items():
        if key not in env_cfg.features:
            continue  # `validate_config` names a mapping to an undeclared feature
        declared = list(env_cfg.features[key].shape)
        shape = list(sub.shape or ())
        if env_cfg.features[key].kind == VISUAL and len(shape) == 3:
            shape = [shape[2], shape[0], shape[1]]  # (H, W, C) -> (C, H, W)
        if shape != declared:
            raise ConfigError(
                f"env.features.{key}.shape={declared} but the env's observation {path_of[key]!r} gives "
                f"{list(sub.shape or ())}; fix the shape (images: [C, H, W]) or env.observation_keys"
            )


def make_env(
    env_cfg: EnvConfig,
    n_envs: int,
    use_async: bool = False,
    autoreset_mode: AutoresetMode = AutoresetMode.NEXT_STEP,
    render_mode: str | None = "rgb_array",
    copy: bool = True,
) -> VectorEnv:
    """Return a vector env of `n_envs` copies of `env_cfg.gym_id` with the config's time limit.

    Every env is wrapped in `BatchKeyObservation`, so observations are flat dicts keyed by batch keys
    (`env_cfg.observation_keys`), ready for `observation_to_batch`.

    Args:
        env_cfg: the env section of the config (gym id, kwargs, `max_episode_steps`, observation keys).
        n_envs: number of parallel envs (>= 1).
        use_async: one worker process per env (AsyncVectorEnv) instead of stepping them in this process.
        autoreset_mode: gymnasium's autoreset mode; `eval_policy` handles all three.
        render_mode: passed to every env so that `render()` works for videos.
        copy: return fresh observation arrays each step. `False` returns the vector env's own buffers
            (overwritten by the next step), saving one copy of every image per step; safe when each
            observation is consumed before the next step, as `eval_policy` and `observation_to_batch` do.
    """
    if n_envs < 1:
        raise ConfigError(f"n_envs={n_envs} must be >= 1")
    _check_env_config(env_cfg)
    args = (
        env_cfg.gym_id,
        env_cfg.max_episode_steps,
        _gym_kwargs(env_cfg),
        render_mode,
        dict(env_cfg.observation_keys),
    )
    if use_async:
        # Pickled into every async worker: lives in a torch-free module.
        fns = [functools.partial(build_worker_env, *args)] * n_envs
        env = _AsyncVectorEnv(fns, context=_START_METHOD, autoreset_mode=autoreset_mode, copy=copy)
    else:
        env = SyncVectorEnv(
            [functools.partial(build_env, *args)] * n_envs, autoreset_mode=autoreset_mode, copy=copy
        )
    try:
        _check_shapes(env_cfg, env.single_observation_space)
    except ConfigError:
        env.close()
        raise
    return env


def measure_vector_steps_per_s(env_cfg: EnvConfig, n_envs: int, use_async: bool, n_steps: int = 40) -> float:
    """Env steps per second of a vector env of `n_envs` stepping random actions (rendering on, no policy)."""
    env = make_env(env_cfg, n_envs, use_async=use_async, copy=False)
    try:
        env.reset(seed=0)
        rng = np.random.default_rng(0)
        low, high = env.single_action_space.low, env.single_action_space.high
        actions = rng.uniform(low, high, size=(n_steps + 5, n_envs, *low.shape)).astype(np.float32)
        for action in actions[:5]:  # warm-up: first steps of fresh workers are slow
            env.step(action)
        start = time.perf_counter()
        for action in actions[5:]:
            env.step(action)
        return n_steps * n_envs / (time.perf_counter() - start)
    finally:
        env.close()


def _choice_cache_path() -> Path:
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "lerobot" / "vector_env_choice.json"


@functools.cache
def measured_async_choice(key: str, env_cfg_yaml: str, n_envs: int) -> bool:
    """Time sync and async stepping for this env and env count (once per machine; cached on disk)."""
    path = _choice_cache_path()
    try:
        cache = json.loads(path.read_text())
    except (OSError, ValueError):
        cache = {}
    if key in cache:
        return bool(cache[key]["async"])
    env_cfg = OmegaConf.to_object(
        OmegaConf.merge(OmegaConf.structured(EnvConfig), OmegaConf.create(env_cfg_yaml))
    )
    sync_rate = measure_vector_steps_per_s(env_cfg, n_envs, use_async=False)
    async_rate = measure_vector_steps_per_s(env_cfg, n_envs, use_async=True)
    choice = async_rate > sync_rate
    log.info(
        "vector env choice for %s: sync %.0f vs async %.0f steps/s -> %s",
        key,
        sync_rate,
        async_rate,
        "async" if choice else "sync",
    )
    cache[key] = {"async": choice, "sync_steps_per_s": sync_rate, "async_steps_per_s": async_rate}
    with contextlib.suppress(OSError):  # a read-only cache only costs a re-measurement next time
        write_json(path, cache, indent=1)
    return choice


def resolve_use_async(setting: str | bool, env_cfg: EnvConfig, n_envs: int) -> bool:
    """Turn `eval.use_async_envs` (true/false/auto) into a decision.

    `auto` is a measurement, not a guess: with one env or one core it is sync; otherwise it times a few
    dozen random-action steps of a sync and an async vector env of `n_envs` (rendering on) and picks the
    faster. The choice is cached per machine (cores), env and env count in
    `~/.cache/lerobot/vector_env_choice.json`, so the probe runs once.
    """
    value = str(setting).lower()
    if value in ("true", "false"):
        return value == "true"
    cores = os.cpu_count() or 1
    if n_envs < 2 or cores < 2:
        return False
    env_yaml = OmegaConf.to_yaml(OmegaConf.structured(env_cfg))
    key = f"{env_cfg.gym_id}|{sorted(dict(env_cfg.gym_kwargs).items())}|n_envs={n_envs}|cores={cores}"
    return measured_async_choice(key, env_yaml, n_envs)
