"""lerobot: train and evaluate visuomotor robot policies on simulated tasks."""

__version__ = "0.1.0"
