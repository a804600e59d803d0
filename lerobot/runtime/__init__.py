"""Run guards: what keeps a run's files whole and its end clean, below everything that writes files.

- `files`: every file is written to a temporary sibling and renamed into place (`atomic_write`), so a kill
  leaves the old file or the new one, never half of one; a full disk is one line naming the file; and the
  `flock` helpers that tell a live writer from a dead one (the run directory's lock is training's:
  `lerobot.training.run_dir.lock`).
- `checksums`: the sha256 of each checkpoint file, verified before it is read.
- `signals`: SIGTERM/SIGUSR1/Ctrl-C become a clean stop at a step boundary.
- `allocator`: freed memory kept for reuse rather than returned to the kernel, set once per command: fresh
  page faults were 12% of a TD-MPC planning call.

Importing this package imports no torch (env and loader workers use `signals`).
"""
