"""How a command ends: errors a user can fix as one line and exit status 2, stops with their signal's code.

On N processes (torchrun) a process that fails says so in one line that starts with its rank (`error: rank 1:
...`) and leaves word for the others (`distributed.report_failure`). The others, whose collectives then fail
or time out, or whom torchrun stops with SIGTERM once a process has ended, say in one line which process
failed or did not answer (`distributed.peer_failure`). All of them exit with status 2 (docs/distributed.md).
"""

from __future__ import annotations

import errno
import logging
import os
import signal
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tqdm.contrib.logging import logging_redirect_tqdm

from lerobot import distributed
from lerobot.errors import EXPECTED_ERRORS
from lerobot.runtime.allocator import keep_freed_memory
from lerobot.runtime.files import no_space_error
from lerobot.runtime.signals import EXIT_CODES, STOP_SIGNALS, StopAborted, ignore_stop_signals


class _Terminated(BaseException):
    """SIGTERM outside a training loop on N processes: how torchrun ends the others once one has ended."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise_terminated(signum: int, frame: object) -> None:
    raise _Terminated(signum)


@contextmanager
def log_above_progress_bars() -> Iterator[None]:
    """Log lines go above tqdm's progress bars, each on its own line, when the root logger writes to the
    console (a command, after `run_command`'s `basicConfig`); a caller whose logging goes elsewhere (a library
    user, a test's capture) keeps its handlers as they are."""
    console = any(
        isinstance(h, logging.StreamHandler) and h.stream in (sys.stdout, sys.stderr)
        for h in logging.getLogger().handlers
    )
    if not console:
        yield
        return
    with logging_redirect_tqdm():
        yield


def run_command(main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """`main(argv)`'s exit code, with every expected failure turned into one line on stderr."""
    keep_freed_memory()  # fewer fresh page faults in the hot loops (lerobot/runtime/allocator.py)
    # On N processes (torchrun) the main one reports progress; the others only warnings and errors.
    logging.basicConfig(
        level=logging.INFO if distributed.is_main() else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    in_main_thread = threading.current_thread() is threading.main_thread()
    # The stop signals' handlers, restored on the way out (None: one not installed from Python, left alone).
    handlers = {s: signal.getsignal(s) for s in STOP_SIGNALS} if in_main_thread else {}
    handlers = {s: h for s, h in handlers.items() if h is not None}
    if in_main_thread and distributed.world_size() > 1:
        # A training loop installs its own handlers (a clean stop); elsewhere SIGTERM unwinds the command, so
        # that a process that torchrun stops because another one failed can say so.
        signal.signal(signal.SIGTERM, _raise_terminated)
    try:
        return main(argv)
    except EXPECTED_ERRORS as e:
        if distributed.raised_on_main(e):
            return 2  # the main process's error, raised on every process: the main one says it
        _ending(handlers)
        print(f"error: {_rank()}{e}", file=sys.stderr)
        distributed.report_failure(f"failed: {e}")
        return 2
    except StopAborted as e:
        code = _peer_failed(e, handlers)
        if code is not None:
            return code
        print(f"stopped by {e} without saving" + (f" ({e.relaunch})" if e.relaunch else ""), file=sys.stderr)
        return EXIT_CODES[e.signum]
    except _Terminated as e:
        code = _peer_failed(e, handlers)
        if code is not None:
            return code
        # A SIGTERM that no failure explains: end by it, as without the handler (nothing to save here).
        distributed.shutdown()
        signal.signal(e.signum, signal.SIG_DFL)
        os.kill(os.getpid(), e.signum)
        return 128 + e.signum
    except KeyboardInterrupt:
        # Outside training (evaluation, conversion): nothing to save; the env workers are already gone.
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_CODES[signal.SIGINT]
    except Exception as e:
        code = _peer_failed(e, handlers)
        if code is not None:
            return code
        _ending(handlers)
        full = no_space_error(e)
        if full is None:
            denied = _denied_error(e)
            if denied is not None:
                line = f"{denied.filename}: {_denied_advice(denied)}"
                print(f"error: {_rank()}{line}", file=sys.stderr)
                distributed.report_failure(f"failed: {line}")
                return 2
            distributed.report_failure(f"failed with an unexpected {type(e).__name__} (see its traceback)")
            raise
        # A full disk (or file size limit) anywhere else than in a checkpoint save, which says more itself.
        print(
            f"error: {_rank()}{full.strerror} writing {full.filename or 'a file'}: {_no_space_advice(full)}",
            file=sys.stderr,
        )
        distributed.report_failure(f"failed: {full.strerror} writing {full.filename or 'a file'}")
        return 2
    finally:
        for signum, handler in handlers.items():
            signal.signal(signum, handler)
        distributed.shutdown()


def _rank() -> str:
    """The prefix of an error line that names the process on N processes (`rank 1: `)."""
    return f"rank {distributed.rank()}: " if distributed.world_size() > 1 else ""


def _ending(handlers: dict[int, object]) -> None:
    """This process ends for a failure: in a live process group it ignores stop signals from here on
    (torchrun sends SIGTERM to every process once one has exited), so that they cut neither its line nor its
    exit status. Without one (a library caller, a test) the handlers are restored as usual."""
    if handlers and distributed.active():
        ignore_stop_signals()
        handlers.clear()  # not restored


def _peer_failed(error: BaseException, handlers: dict[int, object]) -> int | None:
    """Exit status 2, after one line saying which process failed or did not answer, when `error` comes from
    another process (`distributed.peer_failure`); None when it does not."""
    if not distributed.active():
        return None
    _ending(handlers)
    reason = distributed.peer_failure(error)
    if reason is None:
        return None
    print(f"error: {_rank()}{reason}", file=sys.stderr)
    return 2


def _no_space_advice(full: OSError) -> str:
    """What to do about a write that failed for `full.errno` (ENOSPC, EDQUOT or EFBIG)."""
    if full.errno == errno.EFBIG:
        return "the file reached the file size limit: raise it (ulimit -f) or write elsewhere, and run again"
    if full.errno == errno.EDQUOT:
        return "the disk quota is full: free space (or raise the quota) and run again"
    return "free space and run again"


# errno values of a path this process may not write (or read): a read-only file system, missing permissions.
_DENIED_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})


def _denied_error(e: BaseException | None) -> OSError | None:
    """The OSError, among `e` and its causes, saying that a named path is on a read-only file system or not
    permitted to this user; None when there is none (an EPERM without a path, e.g. a signal, is no such
    error)."""
    seen = set()
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if isinstance(e, OSError) and e.errno in _DENIED_ERRNOS and e.filename:
            return e
        e = e.__cause__ or e.__context__
    return None


def _denied_advice(denied: OSError) -> str:
    """What the user does about `denied` (`_denied_error`)."""
    if denied.errno == errno.EROFS:
        return (
            "read-only file system: write elsewhere (output_dir=DIR when training, --output-dir DIR when "
            "evaluating, dataset.cache_dir=DIR for converted datasets) and run again"
        )
    return "permission denied: make it accessible to this user, or use another path, and run again"
