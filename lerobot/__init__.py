"""lerobot: train and evaluate visuomotor robot policies on simulated tasks."""

import os

# Idle OpenMP threads sleep instead of spinning. On a machine with few cores shared with env worker
# processes (or anything else), spinning threads starve each other: measured here with 2 threads on 2
# busy cores, a small conv1d ran 30-70x slower with the default policy. Set it before torch loads;
# a value the user exported wins.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

__version__ = "0.1.0"
