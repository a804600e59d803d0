"""Build gymnasium vector envs from an `EnvConfig`, sync or async."""

from __future__ import annotations

import contextlib
import functools
import importlib
import inspect
import json
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
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
from lerobot.envs.faults import close_now, first_workers, kill_workers, start_time, worker_call
from lerobot.envs.worker import build_env, build_worker_env, env_module, registered_id
from lerobot.errors import ConfigError, EnvWorkerError, RenderingError
from lerobot.runtime.files import user_cache_dir, write_json

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

        self.worker_start_times = [start_time(p.pid) for p in self.processes]  # for `kill_workers`
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
            who = first_workers([f"env worker {i} (pid {self.processes[i].pid})" for i in silent])
            raise EnvWorkerError(
                f"{who} of {self.num_envs} did not answer its start-up within {ASYNC_START_TIMEOUT_S:.0f} s "
                "(stopped or stuck, or the machine is short of memory or cores for that many workers)"
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
    resolve = getattr(_env_creator(env_cfg), "task_names", None)
    if resolve is None:
        raise ConfigError(
            f"env.task={env_cfg.task!r}: env {env_cfg.name!r} runs one task; remove env.task (or use a "
            "multi-task env such as env=metaworld)"
        )
    return list(resolve(_gym_kwargs(env_cfg)["task"]))


def _env_creator(env_cfg: EnvConfig) -> Callable[..., gym.Env]:
    """The class (or function) that gymnasium calls with the env's keyword arguments."""
    entry_point = gym.spec(registered_id(env_cfg.gym_id)).entry_point
    return load_env_creator(entry_point) if isinstance(entry_point, str) else entry_point


def check_env_settings(env_cfg: EnvConfig, renders: str | None = None) -> None:
    """Build one env of `env_cfg` and reset it, so that a setting it cannot take (an unknown task, a misspelt
    or wrong `env.gym_kwargs` value, a feature of another shape) fails at start-up in one line
    (`ConfigError`), not at a run's first evaluation.

    Args:
        env_cfg: the run's env section.
        renders: what the run renders, in words (e.g. "eval videos (...)"); None: nothing. Given, one frame
            is rendered as well, so that an OpenGL backend that cannot render fails here too, saying so.
    """
    _check_env_config(env_cfg)
    env_task_names(env_cfg)  # an unknown task, or env.task on a single-task env
    _check_gym_kwargs(env_cfg)
    try:
        env = make_single_env(env_cfg, render_mode="rgb_array" if renders is not None else None)
        try:
            _check_shapes(env_cfg, env.observation_space)
            env.reset(seed=0)  # a pixel env renders here already
            if renders is not None:
                env.render()
        finally:
            env.close()
    except RenderingError as e:
        raise RenderingError(f"this run renders {renders}, but {e}") from None
    except ConfigError:
        raise
    except (TypeError, ValueError) as e:  # a value of the wrong type or range, as the env's own code says
        detail = (str(e).strip().splitlines() or [""])[0]
        raise ConfigError(
            f"env {env_cfg.name!r} cannot be built with env.gym_kwargs={dict(env_cfg.gym_kwargs)} "
            f"({type(e).__name__}: {detail}); fix the setting it names"
        ) from e


def _check_gym_kwargs(env_cfg: EnvConfig) -> None:
    """Every key of `env.gym_kwargs` is a parameter of the env's constructor (when it takes named ones)."""
    try:
        params = inspect.signature(_env_creator(env_cfg)).parameters
    except (TypeError, ValueError):  # a constructor without a signature: building it is the check
        return
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in params.values()):
        return
    for key in env_cfg.gym_kwargs:
        if key not in params:
            # `render_mode` and `task` come from the run (rendering, env.task), not from env.gym_kwargs.
            takes = ", ".join(name for name in params if name not in ("render_mode", "task"))
            raise ConfigError(
                f"env.gym_kwargs.{key}: env {env_cfg.name!r} ({env_cfg.gym_id}) takes no setting {key!r}; "
                f"it takes {takes} (remove it with ~env.gym_kwargs.{key})"
            )


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
    return user_cache_dir() / "vector_env_choice.json"


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


# Below this many cores `use_async_envs=auto` is sync without measuring: async workers only take turns with
# the main process there (2 cores, 8 envs: PushT 1478 sync vs 377 async steps/s, MetaWorld 1833 vs 1183).
ASYNC_MIN_CORES = 3


def resolve_use_async(setting: str | bool, env_cfg: EnvConfig, n_envs: int) -> bool:
    """Turn `eval.use_async_envs` (true/false/auto) into a decision.

    `auto` is sync with one env or fewer than `ASYNC_MIN_CORES` cores; otherwise it is a measurement, not a
    guess: it times a few dozen random-action steps of a sync and an async vector env of `n_envs` (rendering
    on) and picks the faster. The choice is cached per machine (cores), env and env count in
    `~/.cache/lerobot/vector_env_choice.json`, so the probe runs once.
    """
    value = str(setting).lower()
    if value in ("true", "false"):
        return value == "true"
    cores = usable_cores()
    if n_envs < 2 or cores < ASYNC_MIN_CORES:
        return False
    env_yaml = OmegaConf.to_yaml(OmegaConf.structured(env_cfg))
    key = f"{env_cfg.gym_id}|{sorted(dict(env_cfg.gym_kwargs).items())}|n_envs={n_envs}|cores={cores}"
    return measured_async_choice(key, env_yaml, n_envs)


def usable_cores() -> int:
    """The CPU cores this process may run on (its affinity: `taskset`, a cgroup's cpuset), at least 1."""
    if hasattr(os, "sched_getaffinity"):
        return max(1, len(os.sched_getaffinity(0)))
    return os.cpu_count() or 1


def available_memory_mb() -> float | None:
    """The memory new processes can take without swapping, MB: Linux's MemAvailable, or less where this
    process's cgroup (a container's limit) has less left; None where neither is known."""
    found = []
    with contextlib.suppress(OSError, ValueError, IndexError), open("/proc/meminfo") as f:
        found += [int(line.split()[1]) / 1024 for line in f if line.startswith("MemAvailable:")]
    with contextlib.suppress(OSError, ValueError):
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        if limit != "max":
            used = int(Path("/sys/fs/cgroup/memory.current").read_text())
            found.append((int(limit) - used) / 2**20)
    return min(found) if found else None


# `eval.batch_size=auto`: the most envs it picks (a policy batch of 50 already amortises a CPU forward pass),
# the memory it counts per env (measured with rendering on, docs/evaluation.md: a torch-free async worker
# takes 85 MB (PushT) to 370 MB (MetaWorld, whose first render loads the OpenGL renderer), a sync env 1 to
# 27 MB of the main process), and the share of the available memory all envs may take.
AUTO_MAX_ENVS = 50
ENV_MEMORY_MB = {True: 400.0, False: 40.0}  # async, sync
AUTO_MEMORY_SHARE = 0.5


@dataclass(frozen=True)
class VectorEnvPlan:
    """How many envs an evaluation steps at once and how; `line` says what `auto` chose and why, for the
    start-up log (None when neither setting was `auto`)."""

    n_envs: int
    use_async: bool
    line: str | None


def plan_vector_env(
    batch_size: int | str, use_async_envs: str | bool, env_cfg: EnvConfig, n_episodes: int
) -> VectorEnvPlan:
    """The vector env of an evaluation of `n_episodes` episodes, as `eval.batch_size` and
    `eval.use_async_envs` say.

    `batch_size=auto` picks one env per episode, at most `AUTO_MAX_ENVS`, and no more than fit in
    `AUTO_MEMORY_SHARE` of the memory available at start-up (`ENV_MEMORY_MB` each): the envs of a fixed 50
    once started 50 async workers on a 2-core, 24 GB machine, which never finished starting. With both
    `auto`, sync or async is decided first (`resolve_use_async` at the count an async env would get), since
    it sets what an env costs.
    """
    auto_batch = str(batch_size) == "auto"
    auto_async = str(use_async_envs).lower() == "auto"
    memory = available_memory_mb()

    def fitting(use_async: bool) -> int:
        if not auto_batch:
            return min(int(batch_size), n_episodes)
        fit = AUTO_MAX_ENVS if memory is None else int(memory * AUTO_MEMORY_SHARE / ENV_MEMORY_MB[use_async])
        return max(1, min(n_episodes, AUTO_MAX_ENVS, fit))

    use_async = resolve_use_async(use_async_envs, env_cfg, fitting(True))
    n_envs = fitting(use_async)
    if not (auto_batch or auto_async):
        return VectorEnvPlan(n_envs, use_async, None)
    said = []
    if auto_batch:
        if n_envs == n_episodes:
            why = "one per episode"
        elif n_envs == AUTO_MAX_ENVS:
            why = f"at most {AUTO_MAX_ENVS}"
        else:
            why = f"what fits in {AUTO_MEMORY_SHARE:.0%} of the {memory / 1024:.1f} GB available"
        said.append(f"eval.batch_size=auto: {n_envs} envs ({why})")
    kind = "async" if use_async else "sync"
    cores = usable_cores()
    if auto_async:
        if n_envs < 2:
            why = "one env"
        elif cores < ASYNC_MIN_CORES:
            why = f"{cores} cores"
        else:
            why = f"measured faster on {cores} cores"
        said.append(f"eval.use_async_envs=auto: {kind} ({why})")
    else:
        said.append(kind)
    return VectorEnvPlan(n_envs, use_async, ", ".join(said))
