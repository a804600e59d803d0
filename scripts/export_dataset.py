"""Write a dataset as a LeRobotDataset v3.0: `python scripts/export_dataset.py --out DIR [dataset.root=DIR ...]`."""

import sys

from lerobot.cli import export_main

if __name__ == "__main__":
    sys.exit(export_main())
