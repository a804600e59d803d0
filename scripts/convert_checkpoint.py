"""Make an older checkpoint's training state load safely: `python scripts/convert_checkpoint.py DIR --trust-pickle`."""

import sys

from lerobot.cli import convert_main

if __name__ == "__main__":
    sys.exit(convert_main())
