"""Async env worker faults: name a dead or silent worker in one `EnvWorkerError`, and close a vector env
without waiting on workers that will never answer.

gymnasium's `AsyncVectorEnv.close()` finishes a pending call and then waits for every worker's reply: with
a dead worker (after a `kill -9` or the OOM killer) or a stopped one (SIGSTOP) it waits forever, and
`close(terminate=True)` sends SIGTERM, which a stopped process never acts on. `close_now` SIGKILLs instead.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import multiprocessing.connection
import signal
import threading
import time
from collections.abc import Iterator

from gymnasium.vector import AsyncVectorEnv, VectorEnv

from lerobot.errors import EnvWorkerError

# How long `kill_workers` waits for a killed worker to be reaped; SIGKILL ends even a stopped process at once.
_REAP_TIMEOUT_S = 5.0
# A `Watchdog` kills the workers this long after a call's own timeout has passed without it returning.
_WATCHDOG_GRACE_S = 2.0
# How long `worker_call` waits for the exit status of a worker whose pipe broke.
_EXIT_STATUS_WAIT_S = 2.0


def _describe_exit(code: int | None) -> str:
    if code is None:
        return "exit status unknown"
    if code < 0:
        return f"killed by {signal.Signals(-code).name}: out of memory (see `dmesg`) or killed"
    return f"exit code {code}: see its traceback above"


@contextlib.contextmanager
def worker_call(
    env: AsyncVectorEnv,
    what: str,
    timeout_s: float | None,
    hint: str = "",
    watchdog: Watchdog | None = None,
) -> Iterator[None]:
    """Turn a dead worker, or one silent for `timeout_s`, during `what` into one `EnvWorkerError` naming it;
    `hint` (what to change if the worker is only slow) ends the timeout message. With a `watchdog`, a call
    still running `_WATCHDOG_GRACE_S` after `timeout_s` is ended by killing the workers."""
    if watchdog is not None and timeout_s is not None:
        watchdog.deadline = time.monotonic() + timeout_s + _WATCHDOG_GRACE_S
    try:
        yield
    except (EOFError, OSError) as e:
        if watchdog is not None and watchdog.stopped_workers is not None:
            stopped = watchdog.stopped_workers
            who = ", ".join(f"env worker {i} (pid {env.processes[i].pid})" for i in stopped)
            raise EnvWorkerError(
                f"{who or 'an env worker'} of {env.num_envs} did not finish a {what} within {timeout_s:.0f} s "
                f"(stopped or stuck){hint}"
            ) from None
        # The pipe can break before the exit status is in: give the dead worker a moment to be reaped.
        multiprocessing.connection.wait([p.sentinel for p in env.processes], timeout=_EXIT_STATUS_WAIT_S)
        dead = [(i, p) for i, p in enumerate(env.processes) if not p.is_alive()]
        pipe_error = isinstance(e, (EOFError, BrokenPipeError, ConnectionResetError))
        if not dead and not pipe_error:
            raise  # an OSError the env itself raised in a live worker, passed on by gymnasium
        who = "; ".join(
            f"env worker {i} of {env.num_envs} (pid {p.pid}, {_describe_exit(p.exitcode)})" for i, p in dead
        )
        raise EnvWorkerError(
            f"{who or f'an env worker of {env.num_envs}'} died during {what} ({type(e).__name__})"
        ) from None
    except (TimeoutError, multiprocessing.TimeoutError):  # gymnasium raises the latter
        # Workers that answered have their reply waiting in their pipe; the silent ones do not.
        silent = [i for i, pipe in enumerate(env.parent_pipes) if pipe is not None and not pipe.poll(0)]
        who = ", ".join(f"env worker {i} (pid {env.processes[i].pid})" for i in silent)
        raise EnvWorkerError(
            f"{who or 'an env worker'} of {env.num_envs} did not answer a {what} within {timeout_s:.0f} s "
            f"(stopped or stuck){hint}"
        ) from None
    finally:
        if watchdog is not None:
            watchdog.deadline = math.inf


class Watchdog:
    """A thread that SIGKILLs `env`'s workers once a call to them outlasts its deadline.

    gymnasium's timeout polls each pipe, then reads it without a timeout: a worker stopped halfway through
    sending a reply larger than the pipe buffer (a rendered frame) passes the poll and blocks the read
    forever. The kill turns that read into a broken pipe, which `worker_call` reports as the timeout.
    Setting the deadline costs the rollout one clock read per call.
    """

    def __init__(self, env: AsyncVectorEnv, check_every_s: float = 0.25):
        self.env, self.check_every_s = env, check_every_s
        self.deadline = math.inf
        self.stopped_workers: list[int] | None = None  # set when the watchdog fires
        self._done = threading.Event()
        threading.Thread(target=self._run, name="env-watchdog", daemon=True).start()

    def _run(self) -> None:
        while not self._done.wait(self.check_every_s):
            if time.monotonic() > self.deadline:
                self.stopped_workers = [i for i, p in enumerate(self.env.processes) if _state(p.pid) == "T"]
                for process in self.env.processes:
                    process.kill()  # no-op for a reaped worker; never waits
                return

    def close(self) -> None:
        """Stop watching."""
        self._done.set()


def _state(pid: int | None) -> str:
    """The process state letter from /proc (`T`: stopped), or `?`."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "?"


def kill_workers(env: AsyncVectorEnv) -> None:
    """SIGKILL every live worker of `env`, reap it and close its pipes, without a word to any of them."""
    for process in env.processes:
        if process.is_alive():
            process.kill()
    for process in env.processes:
        process.join(_REAP_TIMEOUT_S)
    for pipe in env.parent_pipes:
        if pipe is not None:
            pipe.close()


def close_now(env: VectorEnv) -> None:
    """Close `env` at once, even when its workers are dead, stopped or in the middle of a call.

    An async env's workers are killed (`kill_workers`); a sync env is closed the ordinary way. Afterwards
    `env.close()` is a no-op, so a caller's `finally: env.close()` returns at once.
    """
    base = env.unwrapped
    if not isinstance(base, AsyncVectorEnv):
        env.close()
        return
    if not base.closed:
        kill_workers(base)
        base.closed = True
