"""How fast a trainer's loop goes: the timing metrics of each log window (`LogWindow`), and a CPU run's early
estimate of its time, with a warning that says what would be faster when it would take hours (`CpuPace`).
"""

from __future__ import annotations

import logging
import time

import torch

log = logging.getLogger(__name__)

# A CPU run whose measured pace puts its end further away than this gets a warning saying what would be
# faster: `LOWER_STEPS`, or what the command line knows of the recipes of the run's policy and env
# (`lerobot.cli.recipes.slow_cpu_run_advice`).
CPU_WARN_HOURS = 6.0
LOWER_STEPS = "lower training.steps"


class LogWindow:
    """The steps since the last log and where their host wall time went, turned into the timing metrics of
    the next log; `pop` starts a new window.

    A trainer counts its steps (the unit of `training.steps`: gradient steps offline, env transitions
    online) and updates (`counted`), and times the part of its iterations that waits for input (`waited`:
    offline each batch, as `data_s`; online each collection, as `collect_s` per vector env step). Nothing
    waits for the device, so a part's time is the time to queue its device work, and that work shows where
    the host next reads a device value:
    - offline the updates are not timed: their time is the window's wall time less the batch waits and the
      time spent on something else (`exclude`: checkpoints, evaluations), read at log time after the
      metrics' host sync, so it includes the device work they queued; the rate is over that wall time.
    - online they are timed (`counted(..., update_s=)`): acting reads the policy's actions on the host, so
      the device work the updates queued shows in the next collection; the rate is over the two timed parts.
    """

    def __init__(self, wait: str, rate: str, samples_per_step: int = 1):
        """`wait`: the name of the waiting part's metric (`data_s`, `collect_s`); `rate`: the throughput's,
        the steps times `samples_per_step` per second (`samples_per_s`, `env_steps_per_s`)."""
        self.wait, self.rate, self.samples_per_step = wait, rate, samples_per_step
        self._restart()

    def _restart(self) -> None:
        self.start = time.perf_counter()
        self.steps = self.updates = self.waits = 0
        self.wait_s = 0.0
        self.update_s: float | None = None  # None: the updates are not timed (the window's rest)

    def waited(self, seconds: float, times: int = 1) -> None:
        """`times` waits for input (batches, vector env steps) took `seconds` in all."""
        self.wait_s += seconds
        self.waits += times

    def counted(self, steps: int, updates: int, update_s: float | None = None) -> None:
        """`steps` more steps with `updates` gradient updates, which took `update_s` seconds when timed."""
        self.steps += steps
        self.updates += updates
        if update_s is not None:
            self.update_s = (self.update_s or 0.0) + update_s

    def exclude(self, seconds: float) -> None:
        """Leave `seconds` spent on something else (a checkpoint, an evaluation) out of the window."""
        self.start += seconds

    @property
    def updates_per_step(self) -> float:
        """Gradient updates per step in the window so far."""
        return self.updates / max(self.steps, 1)

    def pop(self) -> dict[str, float]:
        """Mean seconds per wait and per update and the rate over the window ending now, then start a new
        window."""
        elapsed = time.perf_counter() - self.start
        if self.update_s is None:
            update_s, total = max(elapsed - self.wait_s, 0.0), elapsed
        else:
            update_s, total = self.update_s, self.wait_s + self.update_s
        metrics = {
            self.wait: self.wait_s / max(self.waits, 1),
            "update_s": update_s / max(self.updates, 1),
            self.rate: self.samples_per_step * self.steps / max(total, 1e-9),
        }
        self._restart()
        return metrics


def cpu_run_warning(step_s: float, steps_left: int, advice: str = LOWER_STEPS) -> str | None:
    """The warning for a CPU run of `steps_left` more steps at `step_s` seconds each, ending with `advice`
    (what would be faster), or None when it ends within `CPU_WARN_HOURS`."""
    hours = step_s * steps_left / 3600
    if hours <= CPU_WARN_HOURS:
        return None
    return (
        f"on the CPU this run takes about {hours:,.0f} hours ({step_s:.2f} s per step, {steps_left:,} steps "
        f"left); {advice}"
    )


def cpu_run_estimate(step_s: float, steps_left: int) -> str:
    """The line that estimates the rest of a CPU run: `steps_left` more steps at `step_s` seconds each."""
    minutes = step_s * steps_left / 60
    span = f"{minutes / 60:,.1f} hours" if minutes >= 90 else f"{max(minutes, 1):,.0f} minutes"
    return (
        f"estimate: the training steps take about {span} more on the CPU ({step_s:.2f} s per step, "
        f"{steps_left:,} steps left; evaluations aside)"
    )


class CpuPace:
    """Measures the first iterations of a CPU run's loop (after `warm_up` of them, which include one-time
    setup) and logs once, early, `cpu_run_warning` (ending with `advice`) when the run would take far too
    long, else `cpu_run_estimate`. An iteration is one step offline, one collection and its updates online
    (`n` steps: the transitions collected). Does nothing off the CPU."""

    def __init__(
        self,
        device: torch.device,
        steps_left: int,
        warm_up: int = 1,
        measured: int = 2,
        advice: str = LOWER_STEPS,
    ):
        self.active = device.type == "cpu" and steps_left > warm_up + measured
        self.steps_left = steps_left
        self.warm_up, self.measured = warm_up, measured
        self.advice = advice
        self.done = 0  # iterations counted
        self.steps = 0  # steps counted
        self._start = 0.0
        self._steps_before = 0  # steps counted when the measurement began

    def step(self, n: int = 1) -> None:
        """Count one finished iteration of `n` steps; after `warm_up + measured` of them, log the warning
        or the estimate."""
        if not self.active:
            return
        self.done += 1
        self.steps += n
        if self.done == self.warm_up:
            self._start, self._steps_before = time.perf_counter(), self.steps
        elif self.done == self.warm_up + self.measured:
            self.active = False
            step_s = (time.perf_counter() - self._start) / max(self.steps - self._steps_before, 1)
            warning = cpu_run_warning(step_s, self.steps_left - self.steps, self.advice)
            if warning is not None:
                log.warning(warning)
            else:
                log.info(cpu_run_estimate(step_s, self.steps_left - self.steps))
