"""Config faults, round four: a broken recipe file stops only the runs that use it."""

from __future__ import annotations

from pathlib import Path

from test_checkpoint_faults import one_line_error

from lerobot.cli import train_main

REPO = Path(__file__).resolve().parents[1]
BROKEN_RECIPE = """# @package _global_
defaults:
  - override /env: my_env
  - override /policy: diffusion
training:
  steps: [1, 2
"""


def _config_dir(root: Path) -> Path:
    (root / "env").mkdir(parents=True)
    (root / "experiment").mkdir()
    (root / "env" / "my_env.yaml").write_text((REPO / "configs" / "env" / "pusht_keypoints.yaml").read_text())
    (root / "experiment" / "my_env_cpu.yaml").write_text(BROKEN_RECIPE)
    return root


def test_a_syntax_error_in_a_cpu_recipe_stops_only_the_runs_that_use_it(tmp_path, capsys):
    config_dir = _config_dir(tmp_path / "configs")
    # Another policy and env: the broken file is not their recipe, so the command runs.
    assert (
        train_main(
            [
                "--config-dir",
                str(config_dir),
                "--cfg",
                "job",
                "recipe=auto",
                "policy=act",
                "env=pusht_keypoints",
            ]
        )
        == 0
    )
    assert "Traceback" not in capsys.readouterr().err
    # The env whose CPU recipe it is: one line naming the file and the line, on a CPU (recipe=auto).
    assert (
        train_main(
            ["--config-dir", str(config_dir), "--cfg", "job", "recipe=auto", "policy=diffusion", "env=my_env"]
        )
        == 2
    )
    err = one_line_error(capsys)
    assert f"{config_dir}/experiment/my_env_cpu.yaml, line 7" in err and "not valid YAML" in err, err
