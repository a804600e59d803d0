"""Async env worker faults: name a dead or silent worker in one `EnvWorkerError`, and close a vector env
without waiting on workers that will never answer.

gymnasium's `AsyncVectorEnv.close()` finishes a pending call and then waits for every worker's reply: with
a dead worker (after a `kill -9` or the OOM killer) or a stopped one (SIGSTOP) it waits forever, and
`close(terminate=True)` sends SIGTERM, which a stopped process never acts on. `close_now` SIGKILLs instead.

A call's timeout is enforced in one of two ways. gymnasium's own (`step_wait(timeout=...)`) polls every
worker's pipe before reading it, a cost paid at every step; a `Watchdog` thread instead compares one deadline
with the clock four times a second and kills the workers once it has passed, which costs the caller one clock
read per call. Evaluation's steps, resets and renders use the watchdog alone (`worker_call(...,
polled=False)`); with gymnasium's poll (the default), the watchdog stands behind it.
"""

from __future__ import annotations

import contextlib
import math
import multiprocessing
import multiprocessing.connection
import os
import signal
import threading
import time
from collections.abc import Callable, Iterator

from gymnasium.vector import AsyncVectorEnv, VectorEnv

from lerobot.errors import EnvWorkerError

# How long `kill_workers` waits for a killed worker to be reaped; SIGKILL ends even a stopped process at once.
_REAP_TIMEOUT_S = 5.0
# A `Watchdog` kills the workers this long after a call's own timeout has passed without it returning, when
# gymnasium enforces the timeout itself (the watchdog only catches a read that its poll let through).
_WATCHDOG_GRACE_S = 2.0
# A watchdog whose own wake-up comes this much later than asked was itself stopped (Ctrl-Z, SIGSTOP of the
# process group) or not run (a starved machine): that time does not count against the call it watches.
_WATCHDOG_STALL_S = 1.0
# How long `worker_call` waits for the exit status of a worker whose pipe broke.
_EXIT_STATUS_WAIT_S = 2.0


# How many workers an error names; the others are counted (50 names made a line of 1.4 kB).
_NAMED_WORKERS = 3


def first_workers(names: list[str], separator: str = ", ") -> str:
    """`names` (one per worker) joined with `separator`: the first `_NAMED_WORKERS`, then how many more."""
    more = len(names) - _NAMED_WORKERS
    return separator.join(names[:_NAMED_WORKERS]) + (f" and {more} more" if more > 0 else "")


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
    polled: bool = True,
) -> Iterator[None]:
    """Turn a dead worker, or one silent for `timeout_s`, during `what` into one `EnvWorkerError` naming it;
    `hint` (what to change if the worker is only slow) ends the timeout message. With a `watchdog`, a call
    still running `_WATCHDOG_GRACE_S` after `timeout_s` is ended by killing the workers; `polled=False`: the
    call waits without gymnasium's timeout (no polling cost), and the watchdog ends it at `timeout_s`."""
    if watchdog is not None and timeout_s is not None:
        watchdog.deadline = time.monotonic() + timeout_s + (_WATCHDOG_GRACE_S if polled else 0.0)
    try:
        yield
    except (EOFError, OSError) as e:
        if watchdog is not None and watchdog.stopped_workers is not None:
            stopped = watchdog.stopped_workers
            who = first_workers([f"env worker {i} (pid {env.processes[i].pid})" for i in stopped])
            # Behind gymnasium's poll, the worker had begun its reply; without it, nothing tells them apart.
            verb = "finish" if polled else "answer"
            raise EnvWorkerError(
                f"{who or 'an env worker'} of {env.num_envs} did not {verb} a {what} within {timeout_s:.0f} s "
                f"(stopped or stuck){hint}"
            ) from None
        # The pipe can break before the exit status is in: give the dead worker a moment to be reaped.
        multiprocessing.connection.wait([p.sentinel for p in env.processes], timeout=_EXIT_STATUS_WAIT_S)
        dead = [(i, p) for i, p in enumerate(env.processes) if not p.is_alive()]
        pipe_error = isinstance(e, (EOFError, BrokenPipeError, ConnectionResetError))
        if not dead and not pipe_error:
            raise  # an OSError the env itself raised in a live worker, passed on by gymnasium
        who = first_workers(
            [
                f"env worker {i} of {env.num_envs} (pid {p.pid}, {_describe_exit(p.exitcode)})"
                for i, p in dead
            ],
            "; ",
        )
        raise EnvWorkerError(
            f"{who or f'an env worker of {env.num_envs}'} died during {what} ({type(e).__name__})"
        ) from None
    except (TimeoutError, multiprocessing.TimeoutError):  # gymnasium raises the latter
        # Workers that answered have their reply waiting in their pipe; the silent ones do not.
        silent = [i for i, pipe in enumerate(env.parent_pipes) if pipe is not None and not pipe.poll(0)]
        who = first_workers([f"env worker {i} (pid {env.processes[i].pid})" for i in silent])
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
    Setting the deadline costs the rollout one clock read per call, so the watchdog alone also enforces the
    step timeout (`worker_call(..., polled=False)`). Time during which the watchdog itself was stopped (the
    whole process group stopped with Ctrl-Z, then resumed) moves the deadline on by as much.
    """

    def __init__(self, env: AsyncVectorEnv, check_every_s: float = 0.25):
        self.env, self.check_every_s = env, check_every_s
        self.deadline = math.inf
        self.stopped_workers: list[int] | None = None  # set when the watchdog fires
        self._done = threading.Event()
        threading.Thread(target=self._run, name="env-watchdog", daemon=True).start()

    def _run(self) -> None:
        woke = time.monotonic()
        while not self._done.wait(self.check_every_s):
            now = time.monotonic()
            late = now - woke - self.check_every_s
            woke = now
            if late > _WATCHDOG_STALL_S:  # this process was stopped: so were its calls, not only the workers
                self.deadline += late
            if now > self.deadline:
                self.stopped_workers = [i for i, p in enumerate(self.env.processes) if _state(p.pid) == "T"]
                for process in self.env.processes:
                    process.kill()  # no-op for a reaped worker; never waits
                return

    def close(self) -> None:
        """Stop watching."""
        self._done.set()


def _stat_fields(pid: int | None) -> list[str]:
    """The fields of /proc/<pid>/stat after the command name (the state letter first); [] when the
    process is gone or /proc is not there."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return []


def _state(pid: int | None) -> str:
    """The process state letter from /proc (`T`: stopped), or `?`."""
    fields = _stat_fields(pid)
    return fields[0] if fields else "?"


def start_time(pid: int | None) -> str | None:
    """When process `pid` started (/proc, clock ticks after boot): with the pid, what tells a worker from a
    later process given the same pid; None when it is gone or not known."""
    fields = _stat_fields(pid)
    return fields[19] if len(fields) > 19 else None


class _EnvCalls:
    """Ctrl-C while this process runs an env's own code (a sync env's step, reset or render), raised once that
    call has returned: `with ENV_CALLS: env.step(action)`.

    Such a call runs C code that calls back into Python (gym-pusht's pymunk collision and drawing callbacks),
    and a KeyboardInterrupt raised inside a callback cannot unwind the C code: Python prints it ("Exception
    ignored from cffi callback", with a traceback), drops it, and the evaluation goes on as if no Ctrl-C came.
    While `interrupts_after_env_calls` is in force, Ctrl-C inside a call is noted and raised at its end; anywhere
    else it is raised at once, as by Python's own handler. Entering and leaving costs a counter, not a syscall.
    """

    def __init__(self):
        self.depth = 0
        self.pending = False

    def __enter__(self) -> None:
        self.depth += 1

    def __exit__(self, *exc_info: object) -> None:
        self.depth -= 1
        if self.pending and not self.depth:
            self.pending = False
            raise KeyboardInterrupt

    def handle(self, signum: int, frame: object) -> None:
        if self.depth:
            self.pending = True
        else:
            raise KeyboardInterrupt


ENV_CALLS = _EnvCalls()


def interrupts_after_env_calls() -> Callable[[], None]:
    """Hold Ctrl-C back while an env call runs (`ENV_CALLS`) until the returned function is called.

    Only where Python's own Ctrl-C handler is in place, in the main thread (a trainer's stop handler, say,
    raises nothing and is left alone)."""
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    if signal.getsignal(signal.SIGINT) is not signal.default_int_handler:
        return lambda: None
    ENV_CALLS.pending = False
    signal.signal(signal.SIGINT, ENV_CALLS.handle)
    return lambda: signal.signal(signal.SIGINT, signal.default_int_handler)


def kill_workers(env: AsyncVectorEnv) -> None:
    """SIGKILL every live worker of `env`, reap it and close its pipes, without a word to any of them.

    A forkserver's workers are known alive through the forkserver, and once a SIGTERM to the process group
    has ended it they all read as dead: a worker whose start time (`start_time`, noted when `env` started,
    `worker_start_times`) is still that of a process with its pid is killed all the same, so that no stopped
    worker outlives the run (holding its output open) and no live one writes a traceback when its pipe
    closes."""
    started = getattr(env, "worker_start_times", None) or [None] * len(env.processes)
    for process, start in zip(env.processes, started):
        if process.is_alive():
            process.kill()
        elif start is not None and start_time(process.pid) == start:
            os.kill(process.pid, signal.SIGKILL)
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
