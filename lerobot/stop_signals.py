"""The signals that ask a run to stop, and how a helper process opts out of them (torch-free, so that
env workers can import it)."""

from __future__ import annotations

import signal

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
