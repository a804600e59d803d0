"""Data-parallel training and sharded evaluation on 2 CPU processes (gloo) against the 1-process run.

One module fixture runs everything: the 1-process runs here, the 2-process runs in two spawned processes
that join one gloo group (as `torchrun` would set them up) and check after every update that both hold the
same weights and EMA weights. The tests then compare losses, weights, files and evaluation results.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
from pathlib import Path

import einops
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from safetensors.torch import load_file
from test_dataset import ZARR, write_fake_zarr
from test_diffusion import image_config, obs_batch, stats_for
from test_train import TINY, TINY_IMAGE, metrics

from lerobot import distributed
from lerobot.cli import eval_main, train_main
from lerobot.datasets import StepBatchSampler
from lerobot.policies.diffusion.modeling import ACTION_NOISE, CROP_OFFSETS, TIMESTEPS, DiffusionPolicy
from lerobot.policies.diffusion.vision import random_crop
from lerobot.training.update import TrainStep, shard_training_noise

WORLD = 2
# The keypoints model, as in test_train, with a global batch both processes share.
KEYPOINTS = [*TINY, "env=pusht_keypoints", "training.batch_size=8", "eval.freq=0"]
# The image model with an in-training evaluation at its last step (1 episode per process).
IMAGES = [*TINY, *TINY_IMAGE, "training.steps=3", "training.save_freq=3", "eval.freq=3"]
EVAL = [
    "policy=pusht_scripted",
    "env=pusht_keypoints",
    "env.max_episode_steps=20",
    "eval.n_episodes=5",
    "eval.batch_size=2",
    "eval.use_async_envs=false",
    "eval.max_episodes_rendered=1",
]
# A stochastic policy: each episode draws from its own stream, so the episodes cannot depend on the layout.
EVAL_RANDOM = ["policy=random", *EVAL[1:], "eval.max_episodes_rendered=0"]
LOSS_RTOL = 1e-5


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _spread(update: TrainStep) -> float:
    """Largest difference between this process's weights (and EMA weights) and the main process's."""
    tensors = list(update.policy.parameters())
    if update.ema is not None:
        tensors += list(update.ema.shadow_params)
    flat = torch.cat([t.detach().flatten() for t in tensors])
    copies = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(copies, flat)
    return max((c - copies[0]).abs().max().item() for c in copies)


def _worker(rank: int, port: int, jobs: list[tuple[str, list[str]]], out: str) -> None:
    """One of the 2 processes: join the group as torchrun would set it up, run `jobs` (train or eval
    argument lists), record exit codes and the weight spread after every update."""
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        WORLD_SIZE=str(WORLD),
        LOCAL_RANK=str(rank),
    )
    torch.set_num_threads(1)
    import datetime as dt

    dist.init_process_group("gloo", init_method="env://", timeout=dt.timedelta(seconds=120))
    spreads: list[float] = []
    real_call = TrainStep.__call__
    stop_after: list[int] = []  # a "train_sigterm" job: process 1 gets SIGTERM after its 2nd update

    def checked(self, batch, where):
        output = real_call(self, batch, where)
        spreads.append(_spread(self))
        if stop_after and len(spreads) == stop_after[0]:
            os.kill(os.getpid(), signal.SIGTERM)
        return output

    TrainStep.__call__ = checked
    codes = []
    for kind, args in jobs:
        stop_after[:] = [len(spreads) + 2] if kind == "train_sigterm" and rank == 1 else []
        codes.append((eval_main if kind == "eval" else train_main)(args))
    Path(out, f"rank{rank}.json").write_text(json.dumps({"codes": codes, "spreads": spreads}))
    dist.destroy_process_group()


def _point_last_at(run: Path, step: int) -> None:
    """Make `run` look like a run that stopped right after its checkpoint of `step`."""
    ckpts = run / "checkpoints"
    for path in ckpts.iterdir():
        if path.name not in (f"{step:09d}", "last"):
            shutil.rmtree(path)
    (ckpts / "last").unlink()
    (ckpts / "last").symlink_to(f"{step:09d}")


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> Path:
    base = tmp_path_factory.mktemp("ddp")
    write_fake_zarr(base / "root" / ZARR, lengths=[20, 25, 18, 30])
    data = [f"dataset.root={base / 'root'}", f"dataset.cache_dir={base / 'cache'}"]
    kp = [*KEYPOINTS, *data, "training.steps=6", "training.save_freq=3"]

    # 1 process.
    assert train_main([*kp, f"output_dir={base / 'kp1'}"]) == 0
    assert train_main([*IMAGES, *data, f"output_dir={base / 'img1'}"]) == 0
    assert eval_main([*EVAL, "--output-dir", str(base / "eval1")]) == 0
    assert eval_main([*EVAL_RANDOM, "eval.batch_size=5", "--output-dir", str(base / "random1")]) == 0
    shutil.copytree(base / "kp1", base / "kp1to2", symlinks=True)
    _point_last_at(base / "kp1to2", 3)

    # 2 processes: the same runs, the resume of the 1-process run, a sharded evaluation.
    jobs = [
        ("train", [*kp, f"output_dir={base / 'kp2'}"]),
        ("train", [*IMAGES, *data, f"output_dir={base / 'img2'}"]),
        ("train", [*kp, f"output_dir={base / 'kp1to2'}", "training.resume=true"]),
        ("eval", [*EVAL, "--output-dir", str(base / "eval2")]),
        ("eval", [*EVAL_RANDOM, "--output-dir", str(base / "random2")]),
        ("train_sigterm", [*kp, f"output_dir={base / 'kpstop'}"]),
    ]
    mp.start_processes(_worker, args=(_free_port(), jobs, str(base)), nprocs=WORLD, start_method="spawn")

    # Back on 1 process: resume the 2-process run from its step-3 checkpoint.
    shutil.copytree(base / "kp2", base / "kp2to1", symlinks=True)
    _point_last_at(base / "kp2to1", 3)
    assert train_main([*kp, f"output_dir={base / 'kp2to1'}", "training.resume=true"]) == 0
    return base


def _losses(run: Path) -> list[float]:
    return [r["loss"] for r in metrics(run)]


def _max_rel(a: list[float], b: list[float]) -> float:
    assert len(a) == len(b)
    return max(abs(x - y) / abs(x) for x, y in zip(a, b))


def test_every_process_finishes_with_identical_weights_after_every_step(runs):
    for rank in range(WORLD):
        report = json.loads((runs / f"rank{rank}.json").read_text())
        assert report["codes"] == [0] * 6
        # 6 + 3 + 3 + 2 updates; DDP hands every process the same averaged gradient: bitwise-equal weights.
        assert len(report["spreads"]) == 14
        assert max(report["spreads"]) == 0.0


@pytest.mark.parametrize("run", ["kp", "img"])
def test_two_processes_train_as_one(runs, run):
    one, two = _losses(runs / f"{run}1"), _losses(runs / f"{run}2")
    assert len(one) == (6 if run == "kp" else 3)
    assert _max_rel(one, two) < LOSS_RTOL
    last = "000000006" if run == "kp" else "000000003"
    a = load_file(runs / f"{run}1/checkpoints" / last / "model.safetensors")
    b = load_file(runs / f"{run}2/checkpoints" / last / "model.safetensors")
    for key in a:
        scale = a[key].abs().max().clamp_min(1e-3)
        torch.testing.assert_close(b[key] / scale, a[key] / scale, rtol=0, atol=1e-5)


def test_only_the_main_process_writes(runs):
    # One line per step (a second writer would duplicate them), one eval record, one video.
    assert [r["step"] for r in metrics(runs / "img2")] == [1, 2, 3]
    assert [r["step"] for r in metrics(runs / "img2", "eval")] == [3]
    info = json.loads((runs / "img2/eval/step_000000003/eval_info.json").read_text())
    assert [e["episode_ix"] for e in info["per_episode"]] == [0, 1]
    assert [p.name for p in (runs / "img2/eval").rglob("*.mp4")] == ["eval_episode_0.mp4"]
    assert sorted(p.name for p in (runs / "img2/checkpoints").iterdir()) == ["000000003", "last"]


def test_resume_across_process_counts_is_exact(runs):
    # 1 -> 2 processes and 2 -> 1: the whole trajectory equals the uninterrupted run's.
    reference = _losses(runs / "kp1")
    for run in ("kp1to2", "kp2to1"):
        assert [r["step"] for r in metrics(runs / run)] == [1, 2, 3, 4, 5, 6]
        assert _max_rel(reference, _losses(runs / run)) < LOSS_RTOL


def test_a_stop_signal_to_one_process_stops_all_at_the_same_step(runs):
    # Process 1 alone got SIGTERM after step 2: both stopped there, and process 0 saved the checkpoint.
    assert (runs / "kpstop/checkpoints/last").resolve().name == "000000002"
    assert [r["step"] for r in metrics(runs / "kpstop")] == [1, 2]


def test_sharded_evaluation_merges_into_the_one_process_results(runs):
    one = json.loads((runs / "eval1/eval_info.json").read_text())
    two = json.loads((runs / "eval2/eval_info.json").read_text())
    assert two["per_episode"] == one["per_episode"]
    assert [e["seed"] for e in two["per_episode"]] == [100_000 + i for i in range(5)]
    for key in ("avg_sum_reward", "avg_max_reward", "pc_success", "env_steps"):
        assert two["aggregated"][key] == one["aggregated"][key]
    # Videos come from the main process, whose share starts at episode 0.
    assert [Path(p).name for p in two["video_paths"]] == ["eval_episode_0.mp4"]


def test_a_stochastic_policy_evaluates_the_same_on_two_processes(runs):
    """The random policy over 5 envs in one process, and 2 per process on 2 processes: the same episodes
    (rewards to 1e-12: gym-pusht's own last bit depends on what ran before in the process, test_rollout)."""
    one = json.loads((runs / "random1/eval_info.json").read_text())["per_episode"]
    two = json.loads((runs / "random2/eval_info.json").read_text())["per_episode"]
    exact = ("episode_ix", "seed", "success", "n_steps")
    assert [[e[k] for k in exact] for e in two] == [[e[k] for k in exact] for e in one]
    for key in ("sum_reward", "max_reward"):
        assert [e[key] for e in two] == pytest.approx([e[key] for e in one], rel=1e-12, abs=1e-12)
    assert len({e["sum_reward"] for e in one}) == 5


def test_batch_not_divisible_by_processes_is_one_line(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "3")
    assert train_main([*KEYPOINTS, "training.steps=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "training.batch_size=8" in err and "divisible by the 3 processes" in err


def test_online_training_refuses_several_processes(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert train_main(["policy=tdmpc", "env=pusht_keypoints", "training.steps=1"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "trains on one process only" in err


def test_sweep_refuses_torchrun(monkeypatch, capsys):
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert train_main(["-m", "env=pusht_keypoints", "seed=1,2"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "without torchrun" in err


def test_shards_of_a_step_are_its_global_batch():
    whole = StepBatchSampler(50, 12, seed=3, start_step=5, num_steps=7)
    shards = [StepBatchSampler(50, 12, seed=3, start_step=5, num_steps=7, shard=(i, 3)) for i in range(3)]
    for batch, *parts in zip(whole, *shards):
        assert [i for part in parts for i in part] == batch
    with pytest.raises(ValueError, match="evenly"):
        StepBatchSampler(50, 12, seed=3, shard=(0, 5))


def test_a_shards_random_draws_are_its_rows_of_the_global_batchs(monkeypatch):
    # What the trainer hands process 1 of 2: its samples get the crops, noise and timesteps that the global
    # batch's rows get on one process, and the random stream ends where it does there.
    config = image_config()
    policy = DiffusionPolicy(config, stats_for(config)).train()
    torch.manual_seed(0)
    whole = policy.draw_training_noise(8)
    stream_after_whole = torch.random.get_rng_state()
    monkeypatch.setattr(distributed, "rank", lambda: 1)
    monkeypatch.setattr(distributed, "world_size", lambda: 2)
    torch.manual_seed(0)
    part = shard_training_noise(policy, 4)
    assert torch.equal(torch.random.get_rng_state(), stream_after_whole)
    assert part.keys() == whole.keys() == {CROP_OFFSETS, ACTION_NOISE, TIMESTEPS}
    for key in whole:
        assert torch.equal(part[key], whole[key][4:])

    def crops(images: torch.Tensor, offsets: torch.Tensor) -> torch.Tensor:
        """The random crops of one camera's images (B, n_obs_steps, C, H, W), flattened as the policy does."""
        flat = einops.rearrange(images, "b s c h w -> (b s) c h w")
        corners = einops.rearrange(offsets, "b s n xy -> (b s n) xy")
        return random_crop(flat, tuple(config.crop_shape), offsets=corners)

    images = obs_batch(config, 8)["observation.image"]
    shard_crops = crops(images[4:], part[CROP_OFFSETS])
    assert torch.equal(shard_crops, crops(images, whole[CROP_OFFSETS])[4 * config.n_obs_steps :])
