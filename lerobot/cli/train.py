"""`scripts/train.py`: compose the config and train (`-m`: a Hydra multirun sweep)."""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from lerobot import distributed
from lerobot.checkpoints.run_layout import latest_checkpoint
from lerobot.cli.catalog import (
    HYDRA_HELP,
    TRAIN_SETTINGS,
    command_parser,
    config_dirs,
    config_yaml,
    info_text,
)
from lerobot.cli.compose import compose_train_config
from lerobot.cli.exit import log_above_progress_bars, run_command
from lerobot.cli.recipes import slow_cpu_run_advice
from lerobot.cli.sweep import run_sweep
from lerobot.errors import ConfigError
from lerobot.policy_registry import policy_class
from lerobot.runtime.signals import EXIT_CODES, StopAborted, stop_on_signals
from lerobot.training import train

DESCRIPTION = """\
Train a policy. Every setting is a Hydra override (KEY=VALUE, GROUP=NAME). On a machine without a GPU,
recipe=auto (the default) trains the CPU recipe of the chosen policy and env where one exists, and says so
in one line at start-up; recipe=paper trains the paper-size model."""
EXAMPLES = (
    "python scripts/train.py policy=diffusion env=pusht                 # the main job",
    "python scripts/train.py policy=diffusion env=pusht recipe=paper    # the paper-size model",
    "python scripts/train.py policy=act env=pusht_keypoints eval.freq=2000",
    "python scripts/train.py --cfg job policy=tdmpc env=pusht_keypoints # print the config, train nothing",
    "python scripts/train.py -m env=pusht_keypoints seed=1,2,3          # a sweep (docs/sweeps.md)",
)


def _train(argv: list[str] | None) -> int:
    parser = command_parser(DESCRIPTION, argv, TRAIN_SETTINGS, EXAMPLES)
    parser.add_argument(
        "-m",
        "--multirun",
        action="store_true",
        help="Hydra multirun: one job per combination of comma-separated values (seed=1,2,3), "
        "launched by hydra/launcher (basic, submitit_local, submitit_slurm)",
    )
    parser.add_argument(
        "overrides", nargs="*", help="Hydra overrides, e.g. policy=diffusion env=pusht training.steps=100"
    )
    args = parser.parse_intermixed_args(argv)
    if args.hydra_help:
        print(HYDRA_HELP, end="")
        return 0
    if args.multirun and (args.cfg or args.info):
        raise ConfigError("--cfg job and --info show one run's config: drop -m and pass one job's values")
    if args.multirun:
        if distributed.world_size() > 1:
            raise ConfigError("a sweep (-m) launches its own jobs, one process each; run it without torchrun")

        return run_sweep(args.overrides, search_path=args.config_dir)
    cfg = compose_train_config(args.overrides, search_path=args.config_dir)
    if cfg.eval.record_dataset is not None:
        raise ConfigError(
            "eval.record_dataset records the episodes of scripts/eval.py; evaluate the trained checkpoint "
            "with it (scripts/eval.py --checkpoint <run> eval.record_dataset=DIR)"
        )
    if args.cfg:  # Hydra's --cfg job: the config this command would train with, then nothing else
        print(config_yaml(cfg), end="")
        return 0
    if args.info:
        print(
            info_text(
                cfg, config_dirs(argv), "configs/default.yaml + overrides", f"output_dir: {cfg.output_dir}"
            )
        )
        return 0
    # The policy's code now, not after the data has loaded (minutes on first use): an installation that
    # cannot run it (a torchvision of another torch build) stops here with one line.
    policy_class(cfg.policy.name)
    # Log lines go above the progress bar, each on its own line (not onto the bar's line).
    command = sys.argv[1:] if argv is None else list(argv)
    with stop_on_signals() as stop, log_above_progress_bars():
        try:
            run_dir = train(cfg, slow_run_advice=slow_cpu_run_advice(cfg, config_dirs(argv)))
        except StopAborted as e:  # stopped where nothing could be saved: say what a relaunch does
            last = latest_checkpoint(Path(cfg.output_dir)) if cfg.output_dir is not None else None
            e.relaunch = (
                f"resume from checkpoint {last.name} with: {resume_command(command, cfg.output_dir)}"
                if last is not None
                else "no checkpoint was saved: run the command again to start over"
            )
            raise
    if stop.stopped_at is not None:
        # On N processes every one stopped at that step, for the signal of the lowest rank that got one.
        if distributed.is_main():
            by = stop.received_by_text(distributed.world_size())
            print(
                f"stopped by {stop.name}{by} at step {stop.stopped_at}, "
                f"checkpoint {latest_checkpoint(run_dir)}; resume with: {resume_command(command, run_dir)}",
                file=sys.stderr,
            )
        return EXIT_CODES[stop.stop_signum]
    if distributed.is_main():
        print(f"run directory: {run_dir}")
    return 0


def train_main(argv: list[str] | None = None) -> int:
    """`scripts/train.py`: compose the config and train; returns the exit code."""
    return run_command(_train, argv)


def resume_command(argv: list[str], run_dir: Path | str) -> str:
    """The command line that resumes the run in `run_dir`: this launch's arguments with
    `output_dir=<run_dir>` (in place of the `output_dir` given, if any: without one, every launch gets a new
    timestamped directory) and without a `training.resume=false`, which would refuse the run."""

    def key(arg: str) -> str:
        return arg.split("=", 1)[0].lstrip("+~")

    kept = [a for a in argv if not (key(a) == "training.resume" and a.split("=", 1)[-1] == "false")]
    out = f"output_dir={run_dir}"
    kept = [out if key(a) == "output_dir" else a for a in kept]
    if out not in kept:
        kept.append(out)
    if distributed.world_size() == 1:
        launcher = ["python"]
    else:  # any number of processes resumes it; these are this launch's
        nodes = distributed.world_size() // int(os.environ.get("LOCAL_WORLD_SIZE", distributed.world_size()))
        launcher = ["torchrun", *(["--nnodes", str(nodes)] if nodes > 1 else [])]
        launcher += ["--nproc_per_node", os.environ.get("LOCAL_WORLD_SIZE", str(distributed.world_size()))]
    script = (
        sys.argv[0] if sys.argv[0].endswith(".py") and os.path.isfile(sys.argv[0]) else "scripts/train.py"
    )
    return shlex.join([*launcher, script, *kept])
