"""Which recipe a training run composes: the rule behind `recipe=auto|cpu|paper`.

A recipe is a `configs/experiment/<name>.yaml` file, composed with `+experiment=<name>`. A CPU recipe is one
whose name ends in `_cpu` and whose defaults list picks a policy and an env (`override /policy: diffusion`,
`override /env: pusht`): it is the CPU recipe of that pair, found in `configs/experiment/` or the
`experiment/` folder of a `--config-dir`. The rule:

- `recipe=auto` (the default): where `device` resolves to the CPU, the CPU recipe of the chosen policy and env
  when one exists; on a GPU, and where none exists, the policy's defaults (the paper's model);
- `recipe=cpu`: the CPU recipe on any device (an error naming the CPU recipes when there is none);
- `recipe=paper`: the policy's defaults, whatever the device.

An explicit `+experiment=NAME` composes that recipe and turns the rule off; overrides on the command line apply
on top of whichever recipe is composed. `$LEROBOT_RECIPE` sets the default of `recipe` (`auto` when unset).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import yaml
from omegaconf import DictConfig, OmegaConf

from lerobot import distributed
from lerobot.config import RECIPES
from lerobot.errors import ConfigError
from lerobot.training.pace import LOWER_STEPS

# The override that forces the policy's defaults (the paper-size model), named in every start-up line.
PAPER_OVERRIDE = "recipe=paper"
EXPERIMENT_GROUP = "experiment"


@dataclass(frozen=True)
class RecipeChoice:
    """What the rule decided for one run.

    Attributes:
        experiment: the recipe to compose (`+experiment=<experiment>`), or None to compose what the command
            names as it is.
        line: the one start-up line that says what is trained and which override gives the other size; None
            when there is nothing to say (the command named its recipe, or the policy and env have no CPU
            recipe).
    """

    experiment: str | None
    line: str | None


# A defaults-list entry that picks a group's option, as it reads in the file's text.
_PICKED = re.compile(r"^\s*-\s*override\s+/(policy|env)\s*:\s*([\w.-]+)\s*$", re.MULTILINE)


def recipe_choices(path: Path) -> tuple[str | None, str | None]:
    """`(policy, env)` that the recipe file `path` picks in its defaults list (`override /policy: NAME`,
    `override /env: NAME`); None for one it leaves as the command says.

    A file that is not valid YAML is read for those two lines as text: its syntax error must stop the runs
    that compose it (composing says where) and not every run that looks for a recipe.
    """
    try:
        entries = OmegaConf.load(path).get("defaults", []) or []
    except yaml.YAMLError:
        picked = dict(match.groups() for match in _PICKED.finditer(path.read_text(errors="replace")))
        return picked.get("policy"), picked.get("env")
    picked: dict[str, str] = {}
    for entry in entries:
        if isinstance(entry, Mapping):
            for key, value in entry.items():
                picked[str(key).removeprefix("override").strip().lstrip("/")] = str(value)
    return picked.get("policy"), picked.get("env")


def _recipes(dirs: Sequence[Path], suffix: str) -> dict[str, Path]:
    """Every recipe `experiment/*<suffix>.yaml` in the config directories `dirs`: name -> file, sorted by
    name; the first directory that holds a name wins, as in Hydra's search path."""
    found: dict[str, Path] = {}
    for d in dirs:
        for path in sorted((Path(d) / EXPERIMENT_GROUP).glob(f"*{suffix}.yaml")):
            found.setdefault(path.stem, path)
    return dict(sorted(found.items()))


def cpu_recipes(dirs: Sequence[Path]) -> dict[str, Path]:
    """Every CPU recipe (`experiment/*_cpu.yaml`) in the config directories `dirs` (see `_recipes`)."""
    return _recipes(dirs, "_cpu")


def _recipe_of(policy: str, env: str, dirs: Sequence[Path], suffix: str, kind: str) -> str | None:
    """The name of the `kind` recipe (`*<suffix>.yaml`) of `policy` on `env` (group choices, e.g.
    `diffusion`, `pusht`) in `dirs`, or None. Two recipes for one pair are a config error naming both."""
    names = [name for name, path in _recipes(dirs, suffix).items() if recipe_choices(path) == (policy, env)]
    if len(names) > 1:
        raise ConfigError(
            f"{' and '.join(names)} are both {kind} recipes of policy {policy} on env {env}; keep one of them "
            f"(or rename the other without the {suffix} suffix)"
        )
    return names[0] if names else None


def cpu_recipe(policy: str, env: str, dirs: Sequence[Path]) -> str | None:
    """The name of the CPU recipe (`*_cpu.yaml`) of `policy` on `env` in `dirs`, or None (see `_recipe_of`)."""
    return _recipe_of(policy, env, dirs, "_cpu", "CPU")


def gpu_recipe(policy: str, env: str, dirs: Sequence[Path]) -> str | None:
    """The name of the GPU recipe (`*_gpu.yaml`, the paper-size model sized for one GPU) of `policy` on
    `env` in `dirs`, or None (see `_recipe_of`)."""
    return _recipe_of(policy, env, dirs, "_gpu", "GPU")


def slow_cpu_run_advice(cfg: DictConfig, dirs: Sequence[Path]) -> str:
    """What would be faster than the run of `cfg` on a CPU that would take hours (the end of
    `lerobot.training.pace.cpu_run_warning`): the GPU recipe of its policy and env and, unless it trains
    the CPU recipe already, that recipe, each where one exists in `dirs`; and fewer steps."""
    policy, env = str(cfg.policy.name), str(cfg.env.name)
    gpu, cpu = gpu_recipe(policy, env, dirs), cpu_recipe(policy, env, dirs)
    parts = []
    if cfg.recipe_applied is not None and cfg.recipe_applied in cpu_recipes(dirs):
        if gpu is not None:
            parts.append(f"on a GPU, +experiment={gpu} trains the paper-size model")
    else:
        if gpu is not None:
            parts.append(f"the paper-size model needs a GPU (+experiment={gpu})")
        if cpu is not None:
            parts.append(
                f"on a CPU, +experiment={cpu} trains the CPU recipe of {policy} on {env} (1 to 3 hours on 2 "
                "idle cores)"
            )
    return "; ".join([*parts, "or " + LOWER_STEPS if parts else LOWER_STEPS])


def choose_recipe(cfg: DictConfig, choices: Mapping[str, str | None], dirs: Sequence[Path]) -> RecipeChoice:
    """The recipe a training run composes, per `cfg.recipe` and the device `cfg.device` resolves to.

    Args:
        cfg: the validated config composed from the command line as it is (its `recipe` and `device`).
        choices: Hydra's group choices of that composition (`policy`, `env`, and `experiment` when the
            command gave `+experiment=NAME`).
        dirs: the config directories searched, `configs/` first.

    Raises `ConfigError` for `recipe=cpu` when the policy and env have no CPU recipe.
    """
    mode = str(cfg.recipe)
    if mode not in RECIPES:
        raise ConfigError(f"recipe={mode}: expected one of {', '.join(RECIPES)}")
    if choices.get(EXPERIMENT_GROUP) is not None:
        return RecipeChoice(None, None)  # the command named its recipe: it wins
    policy, env = str(choices.get("policy")), str(choices.get("env"))
    name = cpu_recipe(policy, env, dirs)
    if name is None:
        if mode == "cpu":
            raise ConfigError(
                f"recipe=cpu: policy {policy} on env {env} has no CPU recipe; CPU recipes: "
                f"{', '.join(cpu_recipes(dirs)) or 'none'} (or drop recipe=cpu)"
            )
        return RecipeChoice(None, None)
    device = distributed.auto_device() if cfg.device == "auto" else torch.device(str(cfg.device)).type
    if mode == "cpu" or (mode == "auto" and device == "cpu"):
        if mode == "cpu":
            why = "recipe=cpu"
        else:
            why = "no GPU found" if cfg.device == "auto" else f"device={cfg.device}"
        return RecipeChoice(
            name,
            f"recipe: the CPU recipe {name} (configs/{EXPERIMENT_GROUP}/{name}.yaml; {why}); "
            f"{PAPER_OVERRIDE} trains the paper-size model instead",
        )
    other = "recipe=auto" if device == "cpu" else "recipe=cpu"
    return RecipeChoice(
        None,
        f"recipe: the paper-size model of {policy} on {device} (recipe={mode}); {other} trains the CPU recipe "
        f"{name} instead",
    )
