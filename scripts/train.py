"""Train a policy: `python scripts/train.py policy=diffusion env=pusht [overrides]`."""

import sys

if __name__ == "__main__":
    # Imported here, not above: every async env worker runs this file again (as `__mp_main__`, Python's
    # forkserver and spawn do), and an import above would load torch into each of them (~500 MB apiece).
    from lerobot.cli import train_main

    sys.exit(train_main())
