"""scripts/eval.py end to end on the baseline policies, and its one-line errors on bad input."""

import json
import resource
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from lerobot.checkpoints import load_for_run, locate, save_pretrained
from lerobot.checkpoints.run_writer import checkpoint_files
from lerobot.cli import compose_config, eval_main
from lerobot.config import env_config
from lerobot.policy_registry import make_policy, make_policy_config
from lerobot.training.run_dir.saving import save_checkpoint

REPO = Path(__file__).resolve().parents[1]


def test_eval_script_random_policy_writes_metrics_and_video(tmp_path):
    out = tmp_path / "eval"
    cmd = [
        sys.executable,
        str(REPO / "scripts/eval.py"),
        "policy=random",
        "env=pusht",
        "eval.n_episodes=3",
        "eval.batch_size=2",
        "eval.use_async_envs=false",
        "env.max_episode_steps=15",
        "eval.max_episodes_rendered=1",
        "--output-dir",
        str(out),
    ]
    result = subprocess.run(cmd, capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert '"pc_success"' in result.stdout and '"avg_max_reward"' in result.stdout
    info = json.loads((out / "eval_info.json").read_text())
    assert [e["episode_ix"] for e in info["per_episode"]] == [0, 1, 2]
    assert all(e["n_steps"] == 15 for e in info["per_episode"])
    assert len(info["video_paths"]) == 1 and Path(info["video_paths"][0]).stat().st_size > 0


def test_eval_checkpoint_round_trip(tmp_path):
    """A checkpoint written by save_checkpoint evaluates through the CLI; the wrong env is refused."""
    cfg = compose_config(["policy=pusht_scripted", "env=pusht_keypoints", "env.max_episode_steps=10"])
    policy = make_policy(make_policy_config(cfg.policy, env_config(cfg)))
    ckpt = save_checkpoint(tmp_path / "run", checkpoint_files(0, policy, cfg))
    assert (
        eval_main(
            [
                "--checkpoint",
                str(tmp_path / "run"),
                "eval.n_episodes=2",
                "eval.batch_size=2",
                "eval.use_async_envs=false",
                "eval.max_episodes_rendered=0",
                "--output-dir",
                str(tmp_path / "e"),
            ]
        )
        == 0
    )
    assert json.loads((tmp_path / "e" / "eval_info.json").read_text())["aggregated"]["env_steps"] == 20
    assert eval_main(["--checkpoint", str(ckpt), "env=pusht"]) == 2


def test_output_dir_override_is_where_eval_writes(tmp_path):
    """`output_dir=` (the key training takes) works for eval too, like `--output-dir`."""
    args = ["policy=random", "env=pusht_keypoints", "env.max_episode_steps=5", "eval.n_episodes=1"]
    args += ["eval.batch_size=1", "eval.use_async_envs=false", "eval.max_episodes_rendered=0"]
    assert eval_main([*args, f"output_dir={tmp_path / 'e'}"]) == 0
    assert json.loads((tmp_path / "e" / "eval_info.json").read_text())["aggregated"]["env_steps"] == 5


@pytest.mark.parametrize(
    "args,message",
    [
        (["env=nope"], "available env options"),
        (["policy=nope"], "available policy options"),
        (["policy=random", "eval.n_episodes=0"], "eval.n_episodes"),
        (["policy=random", "eval.bogus=1"], "bogus"),
        (["policy=random", "policy.bogus=1"], "Key 'bogus' not in 'RandomConfig'"),
        (["policy=pusht_scripted", "env=pendulum"], "policy=pusht_scripted fits"),
        (["policy=random", "eval.step_timeout_s=0"], "eval.step_timeout_s"),
        (["policy=random", "eval.schedule=sometimes"], "eval.schedule"),
        (["--checkpoint", "/does/not/exist"], "does not exist"),
        (["policy=diffusion"], "--checkpoint"),
        (["policy=random", "output_dir=a", "--output-dir", "b"], "pass one"),
    ],
)
def test_bad_input_gives_one_clear_line(args, message, capsys):
    assert eval_main(args) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def test_corrupt_checkpoint_is_reported(tmp_path, capsys):
    cfg = compose_config(["policy=random", "env=pusht_keypoints"])
    policy = make_policy(make_policy_config(cfg.policy, env_config(cfg)))
    ckpt = save_checkpoint(tmp_path, checkpoint_files(0, policy, cfg))
    (ckpt / "model.safetensors").write_bytes(b"garbage")
    assert eval_main(["--checkpoint", str(ckpt)]) == 2
    assert "corrupt" in capsys.readouterr().err
    OmegaConf.save(OmegaConf.create({"env": {"features": 3}}), ckpt / "config.yaml")
    assert eval_main(["--checkpoint", str(ckpt)]) == 2
    err = capsys.readouterr().err
    assert "config.yaml is corrupt" in err and len(err.splitlines()) == 1, err


def test_checkpoint_save_is_atomic(tmp_path, monkeypatch):
    cfg = compose_config(["policy=random", "env=pusht_keypoints"])
    policy = make_policy(make_policy_config(cfg.policy, env_config(cfg)))
    save_checkpoint(tmp_path, checkpoint_files(1, policy, cfg))

    def boom(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(torch, "save", boom)
    with pytest.raises(OSError):
        save_checkpoint(tmp_path, checkpoint_files(2, policy, cfg, training_state={"step": 2}))
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["000000001", "last"]
    assert (tmp_path / "checkpoints" / "last").resolve().name == "000000001"


_TINY_ACT = [
    "policy=act",
    "env=pusht_keypoints",
    "env.max_episode_steps=4",
    "policy.dim_model=16",
    "policy.n_heads=2",
    "policy.dim_feedforward=32",
    "policy.n_encoder_layers=1",
    "policy.n_vae_encoder_layers=1",
    "policy.chunk_size=4",
    "policy.n_action_steps=4",
]


def test_raw_weights_evaluates_the_optimizer_weights_of_an_ema_run(tmp_path, capsys):
    """`--raw-weights` loads the training state's own weights of an EMA run, not model.safetensors' averaged
    ones; a run without EMA, a pretrained directory and a baseline are refused in one line each."""
    cfg = compose_config([*_TINY_ACT, "policy.use_ema=true"])
    policy_cfg = make_policy_config(cfg.policy, env_config(cfg))
    features = {**policy_cfg.input_features, **policy_cfg.output_features}
    stats = {
        k: {"mean": torch.full(f.shape, 256.0), "std": torch.full(f.shape, 100.0)}
        for k, f in features.items()
    }
    policy = make_policy(policy_cfg, stats)
    raw = {k: v.clone() for k, v in policy.state_dict().items()}
    averaged = {k: v + 0.5 if v.is_floating_point() else v for k, v in raw.items()}
    ema_state = {"model": raw, "ema": {"shadow_params": list(averaged.values())}}
    ckpt = save_checkpoint(
        tmp_path / "ema", checkpoint_files(3, policy, cfg, ema_state, eval_state_dict=averaged)
    )
    source = locate(ckpt)
    for use_raw, expected in ((False, averaged), (True, raw)):
        loaded = load_for_run(source, cfg, raw_weights=use_raw).state_dict()
        assert all(torch.equal(loaded[k], v) for k, v in expected.items())
    args = [
        "eval.n_episodes=1",
        "eval.batch_size=1",
        "eval.use_async_envs=false",
        "eval.max_episodes_rendered=0",
    ]
    assert (
        eval_main(["--checkpoint", str(ckpt), "--raw-weights", *args, "--output-dir", str(tmp_path / "e")])
        == 0
    )
    assert json.loads((tmp_path / "e" / "eval_info.json").read_text())["aggregated"]["env_steps"] == 4

    capsys.readouterr()  # the progress bar of that evaluation
    plain_cfg = compose_config(_TINY_ACT)
    plain = save_checkpoint(
        tmp_path / "plain", checkpoint_files(3, policy, plain_cfg, {"model": raw, "ema": None})
    )
    pretrained = save_pretrained(policy, tmp_path / "pretrained", env_config(plain_cfg))
    for argv, message in (
        (["--checkpoint", str(plain)], "trained without EMA"),
        (["--checkpoint", str(pretrained)], "pretrained directory"),
        (["policy=random"], "pass --checkpoint DIR"),
    ):
        assert eval_main([*argv, "--raw-weights", *args]) == 2
        err = capsys.readouterr().err.strip()
        assert message in err and len(err.splitlines()) == 1, err


def _video_sized_file_limit() -> None:
    """In the child: a 20 kB file size limit (a 300-step PushT video is larger, eval_info.json smaller);
    SIGXFSZ ignored, so that a write past it fails with EFBIG as on a full disk."""
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, 20_000))


def test_videos_on_a_full_disk_are_one_line_no_broken_file_and_the_figures_are_written(tmp_path):
    out = tmp_path / "eval"
    args = ["policy=random", "env=pusht_keypoints", "eval.n_episodes=2", "eval.batch_size=2"]
    args += ["eval.max_episodes_rendered=2", "eval.use_async_envs=false", "--output-dir", str(out)]
    result = subprocess.run(
        [sys.executable, "scripts/eval.py", *args],
        capture_output=True,
        text=True,
        preexec_fn=_video_sized_file_limit,
        cwd=Path(__file__).resolve().parents[1],
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if "error" in line.lower() or "Exception" in line]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr
    assert "File too large writing" in errors[0] and "eval_episode_" in errors[0]
    assert "the evaluation's figures are in" in errors[0]
    info = json.loads((out / "eval_info.json").read_text())
    assert len(info["per_episode"]) == 2
    assert not list((out / "videos").iterdir())  # no video under its name, no temporary left
