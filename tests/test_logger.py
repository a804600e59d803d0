"""MetricsLogger: jsonl, curves PNG, resume truncation, wandb offline."""

import json

from lerobot.cli import compose_config
from lerobot.training.metrics import MetricsLogger


def read(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_jsonl_plot_and_resume_truncation(tmp_path):
    cfg = compose_config(["policy=random", "env=pusht_keypoints"])
    logger = MetricsLogger(tmp_path, cfg)
    for step in (1, 2, 3):
        logger.log(step, {"loss": 1.0 / step})
    logger.log(3, {"pc_success": 10.0, "avg_max_reward": 0.5}, split="eval")
    logger.close()
    records = read(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["split"]) for r in records] == [
        (1, "train"),
        (2, "train"),
        (3, "train"),
        (3, "eval"),
    ]
    assert records[1]["loss"] == 0.5
    assert (tmp_path / "curves.png").read_bytes()[:4] == b"\x89PNG"
    # A run resumed from step 2 drops what the interrupted run logged after it.
    resumed = MetricsLogger(tmp_path, cfg, resume_step=2)
    resumed.log(3, {"loss": 0.25})
    resumed.close()
    assert [(r["step"], r.get("loss")) for r in read(tmp_path / "metrics.jsonl")] == [
        (1, 1.0),
        (2, 0.5),
        (3, 0.25),
    ]


def test_wandb_offline_needs_no_network(tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_SILENT", "true")
    cfg = compose_config(["policy=random", "env=pusht_keypoints", "wandb.enable=true", "wandb.mode=offline"])
    logger = MetricsLogger(tmp_path, cfg)
    logger.log(1, {"loss": 0.1})
    logger.close()
    assert list((tmp_path / "wandb").glob("offline-run-*"))
