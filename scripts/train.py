"""Train a policy: `python scripts/train.py policy=diffusion env=pusht [overrides]`."""

import sys

from lerobot.cli import train_main

if __name__ == "__main__":
    sys.exit(train_main())
