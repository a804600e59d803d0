"""Edit LeRobotDatasets v3.0 into new ones: `python scripts/edit_dataset.py OPERATION SRC ... --out DIR`
(delete, split, merge, remove-feature, keep-tasks; docs/dataset_edits.md)."""

import sys

from lerobot.cli.edit import edit_main

if __name__ == "__main__":
    sys.exit(edit_main())
