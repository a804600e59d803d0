"""lerobot: train and evaluate visuomotor robot policies on simulated tasks."""

import os

# Idle OpenMP threads sleep instead of spinning: on a machine with few cores shared with env worker
# processes (or anything else), spinning threads starve each other and small operations run far
# slower. Set before torch loads; a value the user exported wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
