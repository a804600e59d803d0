"""Stop signals turned into a clean stop (torch-free, so that env and loader workers can import it): finish the step, save a checkpoint, exit.

`SIGTERM` and `SIGUSR1` (what SLURM and other schedulers send before preempting or at the time limit) and
`SIGINT` (Ctrl-C) only set a flag while a trainer's loop runs; the loop reads it once per step, at the step
boundary, saves a checkpoint and ends (`lerobot.training.progress.TrainingLoop`). A signal that arrives while a
checkpoint is being written therefore lets the write finish. An evaluation in progress is abandoned (it
can take minutes; the resumed run redoes the evaluation of its first step when that one was due), and so is
a wait on env workers that may never answer (the online trainer's vector step, `waiting`). A Ctrl-C after
any stop signal aborts at once; outside the loop (start-up, the final clean-up) a stop signal aborts at once
too, as there is nothing to save. On N processes the loop exchanges every process's signal once per step: one
that reached any of them stops all at the same step, and each records which signal and which ranks got it
(`StopRequest.stopped`), so that the main process's stop line names them and every process exits with that
signal's code.

The handlers are installed by the command line (`stop_on_signals`, around the whole training call, before any
worker process is forked, so forked workers inherit them and keep running until the main process stops
them: a signal sent to the whole process group, as a terminal's Ctrl-C is, does not kill them) and read through `active()` by the loop; library use without them keeps Python's default behaviour.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import Iterator, Sequence
from types import FrameType

log = logging.getLogger(__name__)

# SIGTERM and SIGUSR1: what SLURM and other schedulers send before preempting or at the time limit;
# SIGINT: Ctrl-C.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1, signal.SIGINT)


def ignore_stop_signals(*_: object) -> None:
    """Make this (helper) process ignore the stop signals.

    A terminal's Ctrl-C and a scheduler's SIGTERM reach the whole process group; loader and env workers
    ignore them so that the main process alone decides how the run ends (saving a checkpoint first) and
    then ends its workers itself. Takes and ignores any arguments, so it can be a `worker_init_fn`.
    """
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


# Exit codes after a clean stop: 0 for a scheduler's signal (the run is resumable, the job ends normally
# and the scheduler requeues it), the shell's 128 + 2 for Ctrl-C (so `train && eval` does not go on).
EXIT_CODES = {signal.SIGTERM: 0, signal.SIGUSR1: 0, signal.SIGINT: 130}


class StopAborted(KeyboardInterrupt):
    """A stop signal arrived where no clean stop is possible (start-up, a second Ctrl-C)."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        # What a relaunch does, when the command knows (the training command: resume from which checkpoint
        # with which command line, or start over); the exit line says it.
        self.relaunch: str | None = None


class EvaluationInterrupted(BaseException):
    """A stop signal arrived during an evaluation; a BaseException so that no `except Exception` swallows it."""


class WaitInterrupted(BaseException):
    """A stop signal arrived while the loop waited on env workers (`StopRequest.waiting`): the call is
    abandoned, and the env, whose workers may be halfway through it, must not be used again."""


class StopRequest:
    """What the signal handlers recorded, and where the training loop stands with respect to them."""

    def __init__(self) -> None:
        self.signum: int | None = None  # the first stop signal this process received while armed
        self.stopped_at: int | None = None  # the step at which the loop stopped for a stop signal
        self.stop_signum: int | None = None  # the signal it stopped for (on N processes: maybe another's)
        self.received_by: tuple[int, ...] = ()  # the ranks of the processes that received that signal
        self._armed = False  # a training loop runs and will act on `signum`
        # What a stop signal raises while the loop evaluates or waits on env workers (None: nothing).
        self._interrupt: type[BaseException] | None = None
        self._pid = os.getpid()  # forked workers inherit the handler; only this process acts on it

    @property
    def name(self) -> str:
        """The name (e.g. SIGTERM) of the signal the loop stopped for, else of the one this process got."""
        signum = self.stop_signum if self.stop_signum is not None else self.signum
        return signal.Signals(signum).name if signum is not None else ""

    def stopped(self, step: int, signum: int, received_by: Sequence[int]) -> None:
        """Record that the loop stops at `step` for `signum`, which the processes of ranks `received_by` got
        (this one, or on N processes any of them: all stop at the same step)."""
        self.stopped_at, self.stop_signum, self.received_by = step, signum, tuple(received_by)

    def received_by_text(self, world_size: int) -> str:
        """Which of the `world_size` processes received the signal, for a message (" (received by rank 1)");
        empty on one process."""
        if world_size <= 1 or not self.received_by:
            return ""
        if len(self.received_by) == world_size:
            return f" (received by all {world_size} processes)"
        ranks = ", ".join(map(str, self.received_by))
        return f" (received by rank{'s' if len(self.received_by) > 1 else ''} {ranks})"

    @contextlib.contextmanager
    def armed(self) -> Iterator[None]:
        """While the training loop runs: stop signals are recorded instead of aborting."""
        self._armed = True
        try:
            yield
        finally:
            self._armed = False

    @contextlib.contextmanager
    def _interrupted_by(self, interrupt: type[BaseException]) -> Iterator[None]:
        """While in the block a stop signal raises `interrupt` (one already received: at once)."""
        if self.signum is not None:
            raise interrupt
        self._interrupt = interrupt
        try:
            yield
        finally:
            self._interrupt = None

    def evaluating(self) -> contextlib.AbstractContextManager[None]:
        """While the loop evaluates: a stop signal abandons the evaluation (`EvaluationInterrupted`)."""
        return self._interrupted_by(EvaluationInterrupted)

    def waiting(self) -> contextlib.AbstractContextManager[None]:
        """While the loop waits on env workers (a stopped or hung one never answers): a stop signal abandons
        the wait (`WaitInterrupted`), so that the loop stops at the last step it completed."""
        return self._interrupted_by(WaitInterrupted)

    def handle(self, signum: int, frame: FrameType | None) -> None:
        """The signal handler (runs in the main thread between two Python bytecodes)."""
        if os.getpid() != self._pid:
            return  # a forked worker (e.g. a DataLoader's): the main process stops it when it ends
        # A Ctrl-C after any stop signal: whoever presses it wants out now, whatever the first one was.
        if not self._armed or (signum == signal.SIGINT and self.signum is not None):
            raise StopAborted(signum)
        if self.signum is None:
            self.signum = signum
            again = " again" if signum == signal.SIGINT else ""
            log.warning(
                "%s received: stopping after the current step with a checkpoint (Ctrl-C%s aborts at once)",
                self.name,
                again,
            )
        if self._interrupt is not None:
            interrupt, self._interrupt = self._interrupt, None
            raise interrupt


_active: StopRequest | None = None


def active() -> StopRequest | None:
    """The stop request of the running `stop_on_signals` context, if any."""
    return _active


@contextlib.contextmanager
def stop_on_signals() -> Iterator[StopRequest]:
    """Install the stop handlers for the duration (main thread only; elsewhere a no-op request)."""
    global _active
    request = StopRequest()
    if threading.current_thread() is not threading.main_thread():
        yield request
        return
    previous = {s: signal.signal(s, request.handle) for s in STOP_SIGNALS}
    _active = request
    try:
        yield request
    finally:
        _active = None
        for s, handler in previous.items():
            signal.signal(s, handler)
