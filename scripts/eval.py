"""Evaluate a policy: `python scripts/eval.py --checkpoint DIR [overrides]` or `policy=random env=pusht`."""

import sys

if __name__ == "__main__":
    # Imported here, not above: every async env worker runs this file again (as `__mp_main__`, Python's
    # forkserver and spawn do), and an import above would load torch into each of them (~500 MB apiece).
    from lerobot.cli import eval_main

    sys.exit(eval_main())
