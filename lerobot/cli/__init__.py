"""The command line, the top floor: `scripts/train.py`, `scripts/eval.py` and `scripts/export_dataset.py` are
thin wrappers over the `*_main` functions here. Nothing below this package imports it.

- `compose`: Hydra composition of a run config (and the configs evaluation starts from);
- `train`, `eval`, `export`, `convert`: one module per command; `sweep`: `train.py -m` (Hydra multirun);
- `exit`: the one place that turns an expected error into one line and an exit status.
"""

from lerobot.cli.compose import compose_config, compose_train_config
from lerobot.cli.convert import convert_main
from lerobot.cli.eval import eval_main
from lerobot.cli.export import export_main
from lerobot.cli.train import train_main

__all__ = ["compose_config", "compose_train_config", "convert_main", "eval_main", "export_main", "train_main"]
