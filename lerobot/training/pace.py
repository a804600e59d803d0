"""An early warning for CPU runs that would take far too long, naming the recipes sized for a CPU."""

from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger(__name__)


# A CPU run whose measured pace puts its end further away than this gets a warning naming `CPU_RECIPE`.
CPU_WARN_HOURS = 6.0
CPU_RECIPE = "+experiment=diffusion_pusht_keypoints_cpu"
GPU_RECIPE = "+experiment=diffusion_pusht_gpu"


def cpu_run_warning(step_s: float, steps_left: int) -> str | None:
    """The warning for a CPU run of `steps_left` more steps at `step_s` seconds each, or None when it ends
    within `CPU_WARN_HOURS`."""
    hours = step_s * steps_left / 3600
    if hours <= CPU_WARN_HOURS:
        return None
    return (
        f"on the CPU this run takes about {hours:,.0f} hours ({step_s:.2f} s per step, {steps_left:,} steps "
        f"left); the paper-size models need a GPU ({GPU_RECIPE}). A recipe sized for a CPU: {CPU_RECIPE} "
        "(Diffusion Policy on PushT keypoints, about an hour on 2 cores); or lower training.steps"
    )


class CpuPace:
    """Measures the first steps of a CPU run (after `warm_up` steps, which include one-time setup) and logs
    `cpu_run_warning` once, early, when the run would take far too long. Does nothing off the CPU."""

    def __init__(self, device: torch.device, steps_left: int, warm_up: int = 1, measured: int = 2):
        self.active = device.type == "cpu" and steps_left > warm_up + measured
        self.steps_left = steps_left
        self.warm_up, self.measured = warm_up, measured
        self.done = 0
        self._start = 0.0

    def step(self) -> None:
        """Count one finished step; after `warm_up + measured` of them, log the warning if it applies."""
        if not self.active:
            return
        self.done += 1
        if self.done == self.warm_up:
            self._start = time.perf_counter()
        elif self.done == self.warm_up + self.measured:
            self.active = False
            step_s = (time.perf_counter() - self._start) / self.measured
            warning = cpu_run_warning(step_s, self.steps_left - self.done)
            if warning is not None:
                log.warning(warning)
