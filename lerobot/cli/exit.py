"""How a command ends: errors a user can fix as one line and exit status 2, stops with their signal's code."""

from __future__ import annotations

import logging
import signal
import sys
from collections.abc import Callable

from lerobot import distributed
from lerobot.errors import EXPECTED_ERRORS
from lerobot.runtime.atomic import no_space_error
from lerobot.runtime.signals import EXIT_CODES, StopAborted


def run_command(main: Callable[[list[str] | None], int], argv: list[str] | None) -> int:
    """`main(argv)`'s exit code, with every expected failure turned into one line on stderr."""
    # On N processes (torchrun) the main one reports progress; the others only warnings and errors.
    logging.basicConfig(
        level=logging.INFO if distributed.is_main() else logging.WARNING,
        format="%(asctime)s %(levelname)s %(message)s",
        datefmt="%H:%M:%S",
    )
    try:
        return main(argv)
    except EXPECTED_ERRORS as e:
        if distributed.is_main():
            print(f"error: {e}", file=sys.stderr)
        return 2
    except StopAborted as e:
        print(
            f"stopped by {e} without saving (a later relaunch resumes from checkpoints/last)", file=sys.stderr
        )
        return EXIT_CODES[e.signum]
    except KeyboardInterrupt:
        # Outside training (evaluation, conversion): nothing to save; the env workers are already gone.
        print("interrupted (Ctrl-C)", file=sys.stderr)
        return EXIT_CODES[signal.SIGINT]
    except Exception as e:
        full = no_space_error(e)
        if full is None:
            raise
        # A full disk (or file size limit) anywhere else than in a checkpoint save, which says more itself.
        print(
            f"error: {full.strerror} writing {full.filename or 'a file'}: free space and run again",
            file=sys.stderr,
        )
        return 2
    finally:
        distributed.shutdown()
