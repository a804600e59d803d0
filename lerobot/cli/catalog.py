"""What the commands' Hydra-style flags print: the catalog under `--help`, `--cfg job`, `--info`, `--hydra-help`.

The catalog is read when it is printed, so a new env YAML, a newly registered policy or a new experiment file
appears with nothing else to edit: envs are `env/*.yaml` and experiments `experiment/*.yaml` of every config
directory (each described by the first phrase of its leading comment), policies the registry's names (and
policy variants, `policy/*.yaml`). The most used settings are shown with their defaults, read from the
dataclasses.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Sequence
from pathlib import Path

import yaml
from omegaconf import DictConfig, OmegaConf

from lerobot import distributed
from lerobot.cli.compose import group_options
from lerobot.cli.recipes import EXPERIMENT_GROUP, cpu_recipes, recipe_choices
from lerobot.config import CONFIG_DIR, RECIPE_ENV, RootConfig
from lerobot.policy_registry import available_policies, policy_config_class

# What each kind of policy learns from (`PolicyConfig.training_mode`).
TRAINING_MODES = {"offline": "learns from demonstrations", "online": "learns online", "none": "baseline"}

# The settings a newcomer reaches for first, with one line each; the defaults shown are read from
# `RootConfig` (every field has its full comment in lerobot/config/schema.py).
TRAIN_SETTINGS = (
    ("recipe", "auto | cpu | paper: on a CPU the CPU recipe of the policy and env, else the paper's model"),
    ("device", "auto | cpu | cuda | cuda:N | mps"),
    ("seed", "seeds the model, the data order and the evaluation's policy draws"),
    ("output_dir", "the run directory (null: outputs/train/<date>/<time>_<env>_<policy>); resumes in place"),
    ("training.steps", "gradient steps (online policies: env transitions)"),
    ("training.batch_size", "null: the policy's own"),
    ("training.num_workers", "data loader processes"),
    ("training.use_amp", "bf16 autocast: auto | true | false"),
    ("training.init_from", "start from another run's checkpoint under this config"),
    ("eval.freq", "evaluate every N steps (0: never)"),
    ("eval.n_episodes", "episodes per evaluation"),
    ("dataset.root", "directory of the demonstrations (else $LEROBOT_DATA_ROOT, the cache, a download)"),
    ("wandb.enable", "log to Weights & Biases (wandb.mode=offline needs no network)"),
)
EVAL_SETTINGS = (
    ("eval.n_episodes", "episodes evaluated"),
    ("eval.batch_size", "envs stepped at once; auto: what fits the cores and memory"),
    ("eval.use_async_envs", "auto | true | false: one process per env"),
    ("eval.max_episodes_rendered", "episodes saved as mp4 videos"),
    ("eval.record_dataset", "write the episodes as a LeRobotDataset into this new directory"),
    ("inference.fast", "Diffusion Policy's faster chunk generation (docs/benchmarks.md)"),
    ("device", "auto | cpu | cuda | cuda:N | mps"),
)

HYDRA_HELP = f"""\
Hydra in this command: the config is composed with Hydra's compose API (lerobot/cli/compose.py), not with
@hydra.main, so it takes Hydra's overrides and the flags below, and none of Hydra's runner flags.

Works:
  KEY=VALUE, GROUP=NAME      any setting (training.steps=1000) and any group (env=pusht policy=act)
  +experiment=NAME           a recipe of configs/experiment/ (turns the recipe= rule off)
  -m, --multirun             a sweep over comma-separated values, launched by hydra/launcher=basic,
                             submitit_local or submitit_slurm (docs/sweeps.md)
  --cfg job                  print the resolved, validated config and exit (nothing is trained)
  --info                     print where the config comes from and exit
  --config-dir DIR           one more directory of env/, policy/ and experiment/ YAML files
  hydra.run.dir=DIR          the run directory when output_dir is unset; hydra.sweep.dir=DIR for -m
  {RECIPE_ENV}=auto|cpu|paper  (an environment variable) the default of recipe=

Not available, and why:
  --cfg hydra, --cfg all     Hydra's own node sets nothing here but the run and sweep directories
  --resolve                  --cfg job always prints the resolved values
  --config-path, --config-name  the root config is configs/default.yaml; add configs with --config-dir
  --run, --shell-completion, --package, --experimental-rerun, hydra.job.chdir=true
                             they drive @hydra.main's own runner, which this command does not use
                             (runs never change the working directory)
"""


def describe_yaml(path: Path) -> str:
    """The first phrase of the leading comment of a YAML file (up to the first `:`, `;`, `,` or ` (`), or ''."""
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if not line.startswith("#"):
            return ""
        text = line.lstrip("#").strip()
        if text and not text.startswith("@package"):
            return re.split(r":\s|;|,| \(", text, maxsplit=1)[0].strip()
    return ""


def _group_files(group: str, dirs: Sequence[Path]) -> dict[str, Path]:
    """`{name: file}` of the YAML files of `group` in `dirs` (the first directory holding a name wins)."""
    found: dict[str, Path] = {}
    for d in dirs:
        for path in sorted((Path(d) / group).glob("*.yaml")):
            found.setdefault(path.stem, path)
    return found


def _rows(rows: list[tuple[str, str]], indent: int = 2) -> list[str]:
    width = max((len(name) for name, _ in rows), default=0)
    return [f"{' ' * indent}{name:<{width}}  {text}".rstrip() for name, text in rows]


def env_rows(dirs: Sequence[Path]) -> list[tuple[str, str]]:
    """`(name, description)` of every env `env=NAME` accepts."""
    files = _group_files("env", dirs)
    return [(name, describe_yaml(files[name])) for name in group_options("env", dirs)]


def policy_rows(dirs: Sequence[Path]) -> list[tuple[str, str]]:
    """`(name, description)` of every policy `policy=NAME` accepts: registered ones (what they learn from,
    where their defaults live) and variants in the config directories."""
    files = _group_files("policy", dirs)
    registered = set(available_policies())
    rows = []
    for name in group_options("policy", dirs):
        if name in registered:
            cls = policy_config_class(name)
            mode = TRAINING_MODES.get(cls.training_mode, cls.training_mode)
            rows.append((name, f"{mode}; defaults: {cls.__module__}.{cls.__name__}"))
        else:
            try:
                base = OmegaConf.load(files[name]).get("name")
            except yaml.YAMLError:  # composing it says where (`lerobot.cli.compose.yaml_message`)
                base = "? (not valid YAML)"
            rows.append((name, f"variant of {base} ({files[name]})"))
    return rows


def experiment_rows(dirs: Sequence[Path]) -> list[tuple[str, str]]:
    """`(name, description)` of every recipe `+experiment=NAME` accepts; the name of a CPU recipe, which
    `recipe=auto` picks on a CPU for the policy and env it names, is marked with a `*`."""
    cpu = cpu_recipes(dirs)
    rows = []
    for name, path in _group_files(EXPERIMENT_GROUP, dirs).items():
        marked = name in cpu and all(recipe_choices(path))
        rows.append((f"{name} *" if marked else name, describe_yaml(path)))
    return rows


def settings_rows(settings: Sequence[tuple[str, str]]) -> list[tuple[str, str]]:
    """`(KEY=default, description)` of `settings`, the defaults read from `RootConfig`."""
    defaults = OmegaConf.structured(RootConfig)
    rows = []
    for key, text in settings:
        value = OmegaConf.select(defaults, key)
        shown = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
        rows.append((f"{key}={shown}", text))
    return rows


def catalog(
    dirs: Sequence[Path],
    settings: Sequence[tuple[str, str]],
    examples: Sequence[str],
    experiments: bool = True,
) -> str:
    """The `--help` epilog: envs, policies, experiments (optional), the most used settings, `examples`."""
    lines = ["envs (env=NAME):", *_rows(env_rows(dirs))]
    lines += ["", "policies (policy=NAME):", *_rows(policy_rows(dirs))]
    if experiments:
        title = "experiments (+experiment=NAME; *: the CPU recipe that recipe=auto picks on a CPU):"
        lines += ["", title, *_rows(experiment_rows(dirs))]
    policy_fields = (
        "policy.FIELD=VALUE",
        "any field of the policy's class above, e.g. policy.optimizer_lr=3e-4",
    )
    lines += ["", "most used settings (KEY=VALUE, shown with the default):"]
    lines += _rows([*settings_rows(settings), policy_fields])
    lines += ["", "examples:", *(f"  {example}" for example in examples)]
    lines += [
        "",
        "Hydra: --cfg job prints the resolved config, --info where it comes from, --hydra-help the rest.",
    ]
    return "\n".join(lines)


def config_dirs(argv: Sequence[str] | None) -> list[Path]:
    """The config directories a command line searches: `configs/`, then each `--config-dir DIR` in `argv`
    (read before the full parse, so that `--help` lists what they hold)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("--config-dir", type=Path, action="append", default=[])
    known, _ = pre.parse_known_args(argv)
    return [CONFIG_DIR, *known.config_dir]


def command_parser(
    description: str,
    argv: Sequence[str] | None,
    settings: Sequence[tuple[str, str]],
    examples: Sequence[str],
    experiments: bool = True,
) -> argparse.ArgumentParser:
    """The parser of a command composed by Hydra (train, eval): `--help` lists the catalog (`catalog`), and
    it takes `--config-dir` and Hydra's flags (`add_hydra_flags`)."""
    parser = argparse.ArgumentParser(
        description=description,
        epilog=catalog(config_dirs(argv), settings, examples, experiments=experiments),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--config-dir",
        type=Path,
        action="append",
        default=[],
        help="extra config directory with env/, policy/ and experiment/ YAML files (repeatable)",
    )
    add_hydra_flags(parser)
    return parser


def add_hydra_flags(parser: argparse.ArgumentParser) -> None:
    """`--cfg job`, `--info` and `--hydra-help` (Hydra's flags of the same names, as far as they apply)."""
    parser.add_argument(
        "--cfg",
        choices=["job"],
        help="print the resolved, validated config (YAML) and exit without running (Hydra's --cfg job)",
    )
    parser.add_argument("--info", action="store_true", help="print where the config comes from and exit")
    parser.add_argument(
        "--hydra-help",
        action="store_true",
        help="which of Hydra's flags this command has, and why not others",
    )


def config_yaml(cfg: DictConfig) -> str:
    """The resolved config as YAML, as a checkpoint's config.yaml holds it."""
    return OmegaConf.to_yaml(cfg, resolve=True)


def info_text(cfg: DictConfig, dirs: Sequence[Path], source: str, output: str) -> str:
    """`--info`: where the config of a command comes from (`source`: the command's own first line) and where
    it writes (`output`, e.g. `output_dir: DIR`)."""
    searched = ", ".join(str(d) for d in dirs)
    policy = cfg.policy.name
    cls = policy_config_class(policy) if policy in available_policies() else None
    lines = [
        source,
        f"config search path: {searched}",
        f"env: {cfg.env.name}; policy: {policy}"
        + (f" (defaults: {cls.__module__}.{cls.__name__})" if cls is not None else ""),
        f"recipe: {cfg.recipe}; experiment composed: {cfg.recipe_applied or 'none (the policy defaults)'}",
        f"device: {cfg.device}"
        + (f" ({distributed.auto_device()} here)" if cfg.device == "auto" else "")
        + f"; {output}",
        "every default: lerobot/config/schema.py (RootConfig) and the policy's configuration class; "
        "--cfg job prints the resolved config",
    ]
    return "\n".join(lines)
