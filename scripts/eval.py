"""Evaluate a policy: `python scripts/eval.py --checkpoint DIR [overrides]` or `policy=random env=pusht`."""

import sys

from lerobot.cli import eval_main

if __name__ == "__main__":
    sys.exit(eval_main())
