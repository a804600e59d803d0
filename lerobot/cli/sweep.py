"""`scripts/train.py -m ...`: a Hydra multirun of the trainer, one run directory per job, one summary.

Hydra expands the comma-separated values (`seed=1,2 policy.optimizer_lr=1e-4,3e-4` is four jobs) and its
launcher runs them: one after another (the basic launcher), as local processes (`hydra/launcher=
submitit_local`) or as SLURM jobs (`hydra/launcher=submitit_slurm`). Every job's config is composed and
validated before anything is launched, so a typo fails at once, with one line, not on the cluster. Each
job trains into `hydra.sweep.dir/hydra.sweep.subdir` (its job number); the sweep directory gets
`summary.json` with each job's overrides, status and final metrics.
"""

from __future__ import annotations

import json
import logging
import shlex
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig

from lerobot.cli.compose import compose_config, hydra_overrides, recipe_choice, record_composition, sweep_dir
from lerobot.config import CONFIG_DIR
from lerobot.errors import EXPECTED_ERRORS, ConfigError
from lerobot.policy_registry import validate_run_config
from lerobot.runtime.files import write_text
from lerobot.runtime.signals import stop_on_signals
from lerobot.training import train
from lerobot.training.metrics import METRICS_FILE

log = logging.getLogger(__name__)

SUMMARY_FILE = "summary.json"
# Final metrics printed per job (all of them are in summary.json).
SHOWN = (("train", "loss"), ("eval", "avg_max_reward"), ("eval", "pc_success"))


def sweep_jobs(overrides: Sequence[str]) -> list[list[str]]:
    """Each job's overrides, as Hydra's basic sweeper expands them (a product over swept keys)."""
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from hydra.errors import HydraException

    try:
        parsed = OverridesParser.create().parse_overrides(list(overrides))
        return BasicSweeper.split_arguments(parsed, None)[0]
    except HydraException as e:
        raise ConfigError(str(e).strip().splitlines()[0]) from None


def check_jobs(overrides: Sequence[str], search_path: Sequence[Path] = ()) -> list[DictConfig]:
    """Compose and validate every job's config before launching any; each job needs its own run dir."""

    jobs = sweep_jobs(overrides)
    configs = [compose_config(job, search_path=search_path) for job in jobs]
    output_dirs = [cfg.output_dir for cfg in configs if cfg.output_dir is not None]
    if len(set(output_dirs)) < len(output_dirs):
        raise ConfigError(
            "output_dir= would put several jobs of the sweep into one directory; drop it and set "
            "hydra.sweep.dir=DIR instead (each job writes to DIR/<job number>)"
        )
    return configs


def sweep_recipe(jobs: Sequence[Sequence[str]], search_path: Sequence[Path] = ()) -> str | None:
    """The recipe that `recipe=auto|cpu|paper` picks for the jobs of a sweep, one for all (its start-up line
    logged once); None when it picks none. Jobs it would give different recipes (a sweep over policies or
    envs on a CPU) are refused: a sweep composes one recipe under every job's values."""
    choices = {recipe_choice(job, search_path) for job in jobs}
    picked = {choice.experiment for choice in choices}
    if len(picked) > 1:
        names = ", ".join(sorted(str(name or "the policy defaults") for name in picked))
        raise ConfigError(
            f"recipe={_recipe_of(jobs[0])} picks a different recipe per job of this sweep ({names}); sweep one "
            "policy and env at a time, or pass recipe=paper (the policy defaults for every job)"
        )
    for line in sorted({choice.line for choice in choices if choice.line is not None}):
        log.info(line)
    return picked.pop()


def _recipe_of(job: Sequence[str]) -> str:
    """The value of `recipe=` in a job's overrides (`auto` when it has none: the usual default)."""
    return next((o.partition("=")[2] for o in reversed(job) if o.startswith("recipe=")), "auto")


def train_job(cfg: DictConfig) -> dict[str, Any]:
    """Hydra's task function for one job: train into the job's directory; report, never raise.

    A failing job must not stop the sweep, so its error goes into the job's log and its summary entry.
    """
    from hydra.core.hydra_config import HydraConfig

    run_dir = HydraConfig.get().runtime.output_dir
    record_composition(cfg, HydraConfig.get().runtime.choices)
    if _stopped_by is not None:  # a stop signal ended an earlier job of this process: start no more
        return {"status": "not run", "error": f"the sweep was stopped by {_stopped_by}", "run_dir": run_dir}
    try:
        cfg = validate_run_config(cfg)
        if cfg.output_dir is None:
            cfg.output_dir = run_dir
        with stop_on_signals() as stop:
            run_dir = str(train(cfg))
        if stop.stopped_at is not None:
            _stop_sweep(stop.name)
            return {"status": "stopped", "error": f"stopped by {stop.name} at step {stop.stopped_at}, "
                    "checkpoint saved", "run_dir": run_dir}  # fmt: skip
    except EXPECTED_ERRORS as e:
        log.error("error: %s", e)
        return {"status": "error", "error": str(e), "run_dir": run_dir}
    except Exception as e:
        log.exception("job failed")
        return {"status": "failed", "error": f"{type(e).__name__}: {e}", "run_dir": run_dir}
    return {"status": "completed", "run_dir": run_dir, "final": final_metrics(Path(run_dir))}


_stopped_by: str | None = None


def _stop_sweep(signal_name: str) -> None:
    global _stopped_by
    _stopped_by = signal_name


def final_metrics(run_dir: Path) -> dict[str, dict[str, Any]]:
    """The last record of each split (`train`, `eval`) in `run_dir/metrics.jsonl`."""

    last: dict[str, dict[str, Any]] = {}
    path = run_dir / METRICS_FILE
    if not path.is_file():
        return last
    for line in path.read_text().splitlines():
        try:
            record = json.loads(line)
        except json.JSONDecodeError:  # a line cut by a kill mid-write
            continue
        last[record["split"]] = {k: v for k, v in record.items() if k not in ("split", "time")}
    return last


def run_sweep(overrides: Sequence[str], search_path: Sequence[Path] = ()) -> int:
    """Check every job, launch the sweep with Hydra's configured launcher, write and print the summary.

    Returns the exit code: 0 when every job completed (or a scheduler's SIGTERM/SIGUSR1 stopped it after a
    checkpoint), 2 when a job stopped on an expected error (bad data, divergence, ...), 1 when a job crashed,
    130 after Ctrl-C.
    """
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    experiment = sweep_recipe(sweep_jobs(overrides), search_path)
    if experiment is not None:
        overrides = [f"+experiment={experiment}", *overrides]
    check_jobs(overrides, search_path)
    # One directory for the whole sweep, resolved here once: Hydra resolves `hydra.sweep.dir` again for every
    # job, with that job's config, so the default (which names the env and the policy) would put the jobs of
    # a sweep over envs or policies into different directories, and it cannot be resolved from Hydra's node
    # alone after the jobs ran.
    directory = sweep_dir(sweep_jobs(overrides)[0], search_path)
    pinned = [o for o in overrides if not o.startswith("hydra.sweep.dir=")]
    pinned.append(f"hydra.sweep.dir={_quoted(directory)}")
    with initialize_config_dir(config_dir=str(CONFIG_DIR), version_base=None, job_name="train"):
        batches = GlobalHydra.instance().hydra.multirun(
            config_name="default",
            task_function=train_job,
            overrides=hydra_overrides(pinned, search_path),
        )
    jobs = [job for batch in batches for job in batch]
    summary = [
        {"job": i, "overrides": list(job.overrides or []), **job.return_value} for i, job in enumerate(jobs)
    ]
    path = write_summary(Path(directory), summary)
    statuses = {entry["status"] for entry in summary}
    # Print only what tells the jobs apart: the overrides that differ between them.
    shared = set.intersection(*(set(entry["overrides"]) for entry in summary))
    for entry in summary:
        print(_summary_line(entry, [o for o in entry["overrides"] if o not in shared]))
    print(f"sweep summary: {path}")
    if statuses & {"stopped", "not run"}:
        # The default sweep directory names the launch time: only the directory itself finds the jobs again.
        named = any(o.startswith("hydra.sweep.dir=") for o in overrides)
        again = "" if named else " " + shlex.quote(f"hydra.sweep.dir={directory}")
        print(f"to resume, run the same command{again} (each job resumes from its own directory)")
    if "failed" in statuses:
        return 1
    if "error" in statuses:
        return 2
    return 130 if _stopped_by == "SIGINT" else 0  # a scheduler's stop is a clean end, as for one run


def _quoted(value: str) -> str:
    """`value` as a quoted Hydra override value that Hydra reads back unchanged (spaces, commas, quotes)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    quoted = "'" + value.replace("'", "\\'") + "'"
    if OverridesParser.create().parse_override(f"k={quoted}").value() != value:
        raise ConfigError(f"hydra.sweep.dir={value!r}: Hydra cannot take this path back; pick a plainer one")
    return quoted


def write_summary(sweep_dir: Path, summary: list[dict[str, Any]]) -> Path:
    """Write `sweep_dir/summary.json` atomically; return its path."""
    path = sweep_dir / SUMMARY_FILE
    return write_text(path, json.dumps({"jobs": summary}, indent=2) + "\n")


def _summary_line(entry: dict[str, Any], swept: list[str]) -> str:
    head = f"job {entry['job']} [{' '.join(swept)}]: {entry['status']}"
    if entry["status"] != "completed":
        return f"{head}: {entry['error']}"
    final = entry["final"]
    shown = [f"step {final['train']['step']}"] if "train" in final else []
    shown += [f"{split} {key} {final[split][key]:.4g}" for split, key in SHOWN if key in final.get(split, {})]
    return f"{head}: {', '.join(shown)}"
