"""The dataset layer on a tiny synthetic PushT zarr: conversion, windows, statistics, errors, loaders."""

from __future__ import annotations

import json
import os
import shutil
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
import zarr

from lerobot.config import DatasetConfig, EnvConfig, FeatureConfig
from lerobot.constants import DATA_ROOT_ENV
from lerobot.datasets import (
    EpisodeDataset,
    StepBatchSampler,
    cycle_batches,
    make_dataloader,
    make_dataset,
    pusht_import,
    split_episodes,
)
from lerobot.datasets.format import META_FILE
from lerobot.datasets.pusht_import import convert_pusht_zarr, find_pusht_source, prepare_pusht
from lerobot.datasets.pusht_rules import block_keypoints, coverage_reward
from lerobot.errors import ConfigError, DatasetError, DatasetNotFoundError, DeltaTimestampsError

LENGTHS = [3, 5, 4, 6]  # 18 frames in 4 episodes
H = W = 8
ZARR = "pusht_cchi_v7_replay.zarr"


def write_fake_zarr(
    path: Path, lengths=LENGTHS, seed: int = 0, img_chunk: int = 4, image_size: int = H
) -> dict[str, np.ndarray]:
    """A PushT-shaped zarr (format 2) with random content; returns the arrays written."""
    rng = np.random.default_rng(seed)
    n = sum(lengths)
    state = np.column_stack([rng.uniform(50, 450, (n, 4)), rng.uniform(0, 2 * np.pi, n)]).astype(np.float32)
    # A few poses on the goal so that some rewards and successes are 1 / True.
    state[5:7, 2:5] = [256.0, 256.0, np.pi / 4]
    arrays = {
        "data/img": rng.integers(0, 256, (n, image_size, image_size, 3)).astype(np.float32),
        "data/state": state,
        "data/action": rng.uniform(0, 512, (n, 2)).astype(np.float32),
        "data/keypoint": rng.uniform(0, 512, (n, 9, 2)).astype(np.float32),
        "meta/episode_ends": np.cumsum(lengths).astype(np.int64),
    }
    group = zarr.open_group(str(path), mode="w", zarr_format=2)
    for name, values in arrays.items():
        parent, leaf = name.split("/")
        sub = group.require_group(parent)
        chunks = (img_chunk, *values.shape[1:]) if leaf == "img" else values.shape
        sub.create_array(leaf, data=values, chunks=chunks)
    return arrays


@pytest.fixture(scope="module")
def fake(tmp_path_factory) -> tuple[Path, Path, dict[str, np.ndarray]]:
    """(zarr path, converted dataset dir, source arrays), converted once for the module."""
    base = tmp_path_factory.mktemp("fake")
    src = base / "data" / ZARR
    arrays = write_fake_zarr(src)
    out = convert_pusht_zarr(src, base / "cache" / "pusht" / "v1")
    return src, out, arrays


# ------------------------------------------------------------------------------------------- conversion


def test_converted_arrays_match_source_and_rules(fake):
    src, out, arrays = fake
    meta = json.loads((out / META_FILE).read_text())
    n = sum(LENGTHS)
    assert meta["fps"] == 10 and meta["num_frames"] == n and meta["num_episodes"] == 4
    assert meta["episode_ends"] == [3, 8, 12, 18]
    assert meta["features"]["observation.image"] == {"shape": [3, H, W], "dtype": "uint8", "kind": "visual"}

    img = np.load(out / "observation.image.npy")
    assert img.dtype == np.uint8 and img.shape == (n, 3, H, W)
    np.testing.assert_array_equal(img, arrays["data/img"].astype(np.uint8).transpose(0, 3, 1, 2))
    state = arrays["data/state"].astype(np.float64)
    np.testing.assert_array_equal(np.load(out / "observation.state.npy"), arrays["data/state"][:, :2])
    np.testing.assert_allclose(
        np.load(out / "observation.environment_state.npy"), block_keypoints(state[:, 2:5]), rtol=1e-6
    )
    np.testing.assert_array_equal(np.load(out / "action.npy"), arrays["data/action"])

    # Reward/success of frame t are those of the pose at t + 1 in the same episode; last frames use their own.
    next_frame = np.array([1, 2, 2, 4, 5, 6, 7, 7, 9, 10, 11, 11, 13, 14, 15, 16, 17, 17])
    reward, success = coverage_reward(state[next_frame, 2:5])
    np.testing.assert_allclose(np.load(out / "next.reward.npy"), reward, rtol=1e-6)
    np.testing.assert_array_equal(np.load(out / "next.success.npy"), success)
    assert success[4] and success[5] and not success[6]  # frames 5, 6 sit on the goal
    np.testing.assert_array_equal(np.flatnonzero(np.load(out / "next.done.npy")), [2, 7, 11, 17])
    np.testing.assert_array_equal(np.load(out / "episode_index.npy"), np.repeat(np.arange(4), LENGTHS))
    frame_index = np.concatenate([np.arange(k) for k in LENGTHS])
    np.testing.assert_array_equal(np.load(out / "frame_index.npy"), frame_index)
    np.testing.assert_allclose(np.load(out / "timestamp.npy"), frame_index / 10, rtol=1e-6)


def test_conversion_is_idempotent_and_follows_source_changes(fake, tmp_path):
    src, _, _ = fake
    out = tmp_path / "v1"
    convert_pusht_zarr(src, out)
    before = {p.name: p.stat().st_mtime_ns for p in out.iterdir()}
    assert convert_pusht_zarr(src, out) == out
    assert {p.name: p.stat().st_mtime_ns for p in out.iterdir()} == before, "second run must not rewrite"

    other = tmp_path / "other" / ZARR
    new_arrays = write_fake_zarr(other, seed=7)
    convert_pusht_zarr(other, out)
    np.testing.assert_array_equal(np.load(out / "action.npy"), new_arrays["data/action"])
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "no temp/old dirs may remain"


def test_interrupted_conversion_leaves_no_dataset(fake, tmp_path, monkeypatch):
    src, _, _ = fake
    out = tmp_path / "v1"

    def crash(*args, **kwargs):
        raise KeyboardInterrupt  # as if the user hit Ctrl-C while images were being written

    monkeypatch.setattr(pusht_import, "_write_images", crash)
    with pytest.raises(KeyboardInterrupt):
        convert_pusht_zarr(src, out)
    assert not out.exists() and list(tmp_path.iterdir()) == []
    monkeypatch.undo()

    # A hard kill leaves its temp dir behind, even a complete-looking one; it is never taken for a dataset
    # and is swept by the next conversion (its process no longer exists).
    leftover = tmp_path / ".v1.tmp-999999999-deadbeef"
    shutil.copytree(fake[1], leftover)
    (leftover / "observation.image.npy").write_bytes(b"partial")
    with pytest.raises(DatasetNotFoundError, match="not a converted dataset"):
        EpisodeDataset(out)
    convert_pusht_zarr(src, out)
    assert not leftover.exists()
    assert len(EpisodeDataset(out)) == sum(LENGTHS)


# ----------------------------------------------------------------------------------------- bad sources


def _broken_copy(fake, tmp_path) -> Path:
    dest = tmp_path / ZARR
    shutil.copytree(fake[0], dest)
    return dest


def test_missing_array_is_named(fake, tmp_path):
    src = _broken_copy(fake, tmp_path)
    shutil.rmtree(src / "data" / "action")
    with pytest.raises(DatasetError, match=r"missing array 'data/action'") as e:
        convert_pusht_zarr(src, tmp_path / "v1")
    assert str(src) in str(e.value)
    assert not (tmp_path / "v1").exists()


def test_mismatched_lengths_are_named(fake, tmp_path):
    src = _broken_copy(fake, tmp_path)
    group = zarr.open_group(str(src), mode="a", zarr_format=2)
    del group["data/action"]
    group["data"].create_array("action", data=np.ones((sum(LENGTHS) - 1, 2), np.float32))
    with pytest.raises(DatasetError, match="different numbers of frames"):
        convert_pusht_zarr(src, tmp_path / "v1")


def test_truncated_chunk_is_named(fake, tmp_path):
    src = _broken_copy(fake, tmp_path)
    chunk = src / "data" / "img" / "1.0.0.0"
    chunk.write_bytes(chunk.read_bytes()[:40])
    with pytest.raises(DatasetError, match=r"data/img: frames 0\.\.17 corrupt or truncated chunk"):
        convert_pusht_zarr(src, tmp_path / "v1")
    assert not (tmp_path / "v1").exists() and not list(tmp_path.glob(".v1*"))


def test_missing_chunk_is_named(fake, tmp_path):
    src = _broken_copy(fake, tmp_path)
    (src / "data" / "img" / "2.0.0.0").unlink()
    with pytest.raises(DatasetError, match=r"data/img: 1 of 5 chunks are missing"):
        convert_pusht_zarr(src, tmp_path / "v1")


def test_bad_episode_ends_are_named(fake, tmp_path):
    src = _broken_copy(fake, tmp_path)
    group = zarr.open_group(str(src), mode="a", zarr_format=2)
    group["meta/episode_ends"][:] = np.array([3, 8, 12, 17])
    with pytest.raises(DatasetError, match="meta/episode_ends: must increase strictly"):
        convert_pusht_zarr(src, tmp_path / "v1")


def test_not_a_zarr_is_named(tmp_path):
    bogus = tmp_path / ZARR
    bogus.mkdir()
    (bogus / "junk.txt").write_text("hello")
    with pytest.raises(DatasetError, match=str(bogus)):
        convert_pusht_zarr(bogus, tmp_path / "v1")


def test_corrupt_converted_array_is_named(fake, tmp_path):
    out = tmp_path / "v1"
    shutil.copytree(fake[1], out)
    path = out / "action.npy"
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DatasetError, match=r"action\.npy: truncated or corrupt"):
        EpisodeDataset(out)


# ------------------------------------------------------------------------------------- data resolution


def _zip_of(src: Path, zip_path: Path) -> Path:
    with zipfile.ZipFile(zip_path, "w") as zf:
        for file in sorted(src.rglob("*")):
            if file.is_file():
                zf.write(file, Path("pusht") / ZARR / file.relative_to(src))
    return zip_path


def test_root_then_env_var_then_cache(fake, tmp_path, monkeypatch):
    src = fake[0]
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    cache = tmp_path / "cache"
    assert find_pusht_source(DatasetConfig(root=str(src.parent), cache_dir=str(cache))) == src
    monkeypatch.setenv(DATA_ROOT_ENV, str(src.parent))
    assert find_pusht_source(DatasetConfig(cache_dir=str(cache))) == src

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DatasetNotFoundError, match=r"dataset.root=.*empty: no pusht_cchi_v7_replay.zarr"):
        find_pusht_source(DatasetConfig(root=str(empty), cache_dir=str(cache)))
    monkeypatch.setenv(DATA_ROOT_ENV, str(empty))
    with pytest.raises(DatasetNotFoundError, match=r"\$LEROBOT_DATA_ROOT="):
        find_pusht_source(DatasetConfig(cache_dir=str(cache)))


def test_zip_in_root_is_unpacked_into_cache(fake, tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    root = tmp_path / "root"
    root.mkdir()
    _zip_of(fake[0], root / "pusht.zip")
    cfg = DatasetConfig(root=str(root), cache_dir=str(tmp_path / "cache"))
    out = prepare_pusht(cfg, download=False)
    assert out == tmp_path / "cache" / "pusht" / "v1"
    assert (tmp_path / "cache" / "pusht" / ZARR / "data" / "img").is_dir()
    assert len(EpisodeDataset(out)) == sum(LENGTHS)


def test_download_when_nothing_is_local(fake, tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    served = _zip_of(fake[0], tmp_path / "served.zip")
    cfg = DatasetConfig(cache_dir=str(tmp_path / "cache"))
    out = prepare_pusht(cfg, url=served.as_uri())
    assert (tmp_path / "cache" / "pusht" / "pusht.zip").is_file()
    assert EpisodeDataset(out).num_episodes == 4
    # Later calls find the unpacked copy and never download again.
    assert prepare_pusht(cfg, url="http://127.0.0.1:9/nowhere.zip") == out


def test_offline_error_says_where_to_put_data(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    cache = tmp_path / "cache"
    with pytest.raises(DatasetNotFoundError) as e:
        prepare_pusht(DatasetConfig(cache_dir=str(cache)), url="http://127.0.0.1:9/pusht.zip")
    message = str(e.value)
    for needle in (str(cache / "pusht"), "pusht.zip", ZARR, "dataset.root", DATA_ROOT_ENV, "download"):
        assert needle in message
    assert list((cache / "pusht").iterdir()) == [], "a failed download leaves no partial file"


def test_corrupt_zip_is_named(tmp_path, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    (tmp_path / "pusht.zip").write_bytes(b"PK\x03\x04 definitely not a zip")
    with pytest.raises(DatasetError, match=r"pusht\.zip: not a readable zip"):
        prepare_pusht(DatasetConfig(root=str(tmp_path), cache_dir=str(tmp_path / "cache")))


# ------------------------------------------------------------------------------------------- windows


def _expected_window(t: int, offsets: list[int], starts: np.ndarray, ends: np.ndarray):
    """Clamped global frames and pad mask for frame `t`, the slow obvious way."""
    ep = int(np.searchsorted(ends, t, side="right"))
    frames, pads = [], []
    for k in offsets:
        f = t + k
        pads.append(not starts[ep] <= f < ends[ep])
        frames.append(min(max(f, starts[ep]), ends[ep] - 1))
    return frames, pads


@pytest.mark.parametrize("episodes", [None, [1, 3]])
def test_windows_pad_and_clamp_within_episode(fake, episodes):
    _, out, arrays = fake
    delta = {
        "action": [-0.2, -0.1, 0.0, 0.1, 0.2],
        "observation.state": [-0.1, 0.0],
        "observation.image": [0.0, 0.3],
    }
    ds = EpisodeDataset(out, delta_timestamps=delta, episodes=episodes)
    ends = np.cumsum(LENGTHS)
    starts = ends - LENGTHS
    chosen = range(4) if episodes is None else episodes
    global_frames = np.concatenate([np.arange(starts[e], ends[e]) for e in chosen])
    assert len(ds) == len(global_frames) and ds.num_episodes == len(list(chosen))
    images = arrays["data/img"].transpose(0, 3, 1, 2) / 255.0
    for i, t in enumerate(global_frames):
        item = ds[i]
        assert item["index"].item() == t
        frames, pads = _expected_window(t, [-2, -1, 0, 1, 2], starts, ends)
        np.testing.assert_array_equal(item["action"].numpy(), arrays["data/action"][frames])
        assert item["action_is_pad"].tolist() == pads
        frames, pads = _expected_window(t, [-1, 0], starts, ends)
        np.testing.assert_array_equal(item["observation.state"].numpy(), arrays["data/state"][frames, :2])
        assert item["observation.state_is_pad"].tolist() == pads
        frames, pads = _expected_window(t, [0, 3], starts, ends)
        assert item["observation.image"].shape == (2, 3, H, W)
        np.testing.assert_allclose(item["observation.image"].numpy(), images[frames], rtol=1e-6)
        assert item["observation.image_is_pad"].tolist() == pads
        # Features without offsets are single frames.
        assert item["next.reward"].shape == () and item["observation.environment_state"].shape == (16,)


def test_window_edges_explicitly(fake):
    _, out, _ = fake
    ds = EpisodeDataset(out, delta_timestamps={"action": [-0.1, 0.0, 0.1]}, keys=["action"])
    # Episode 1 covers global frames 3..7: its first frame pads the past, its last frame pads the future.
    assert ds[3]["action_is_pad"].tolist() == [True, False, False]
    assert ds[7]["action_is_pad"].tolist() == [False, False, True]
    assert ds[5]["action_is_pad"].tolist() == [False, False, False]
    torch.testing.assert_close(ds[3]["action"][0], ds[3]["action"][1])  # clamped to the first frame
    torch.testing.assert_close(ds[7]["action"][2], ds[7]["action"][1])  # clamped to the last frame


def test_batched_fetch_equals_single_items(fake):
    _, out, _ = fake
    ds = EpisodeDataset(out, delta_timestamps={"action": [0.0, 0.1, 0.2], "observation.image": [-0.1, 0.0]})
    indices = [17, 0, 5, 5, -1]
    batch = ds.__getitems__(indices)
    assert (
        batch["observation.image"].shape == (5, 2, 3, H, W)
        and batch["observation.image"].dtype == torch.float32
    )
    assert batch["action_is_pad"].shape == (5, 3) and batch["action_is_pad"].dtype == torch.bool
    assert batch["episode_index"].dtype == torch.int64
    for row, index in enumerate(indices):
        for key, value in ds[index].items():
            torch.testing.assert_close(batch[key][row], value)
    with pytest.raises(IndexError):
        ds.__getitems__([18])


@pytest.mark.parametrize(
    ("delta", "message"),
    [
        (
            {"action": [0.0, 0.05]},
            r"delta_timestamps\['action'\]\[1\]=0.05 s is not a multiple of 1/fps = 0.1 s",
        ),
        ({"action": []}, "is empty"),
        ({"action": "0.1"}, "must be a list of offsets"),
        ({"action": [0.0, "0.1"]}, "is not a number of seconds"),
        ({"velocity": [0.0]}, "'velocity', which is not a loaded feature"),
        ([0.0, 0.1], "must map feature -> list of offsets"),
    ],
)
def test_bad_delta_timestamps(fake, delta, message):
    with pytest.raises(DeltaTimestampsError, match=message):
        EpisodeDataset(fake[1], delta_timestamps=delta)


def test_float_noise_in_offsets_is_tolerated(fake):
    ds = EpisodeDataset(
        fake[1], delta_timestamps={"action": [0.1 * k for k in range(-1, 15)]}, keys=["action"]
    )
    assert ds[0]["action"].shape == (16, 2)


def test_delta_timestamps_from_a_hydra_config(fake):
    from omegaconf import OmegaConf

    delta = OmegaConf.create({"action": [-0.1, 0.0, 0.1]})
    ds = EpisodeDataset(fake[1], delta_timestamps=delta, keys=["action"])
    assert ds.delta_timestamps == {"action": [-0.1, 0.0, 0.1]}
    assert ds[3]["action_is_pad"].tolist() == [True, False, False]


# ------------------------------------------------------------------------------------------ statistics


def test_stats_equal_numpy_over_chosen_episodes(fake):
    _, out, arrays = fake
    ds = EpisodeDataset(out, episodes=[0, 1, 2], stats_episodes=[1, 3])
    ends = np.cumsum(LENGTHS)
    rows = np.concatenate([np.arange(ends[e] - LENGTHS[e], ends[e]) for e in (1, 3)])
    images = arrays["data/img"][rows] / 255.0
    expected = {
        "observation.image": {
            "mean": images.mean((0, 1, 2)),
            "std": images.std((0, 1, 2)),
            "min": images.min((0, 1, 2)),
            "max": images.max((0, 1, 2)),
        }
    }
    for key, values in {
        "observation.state": arrays["data/state"][rows, :2],
        "action": arrays["data/action"][rows],
        "observation.environment_state": np.load(out / "observation.environment_state.npy")[rows],
        "next.reward": np.load(out / "next.reward.npy")[rows],
    }.items():
        v = values.astype(np.float64)
        expected[key] = {"mean": v.mean(0), "std": v.std(0), "min": v.min(0), "max": v.max(0)}
    stats = ds.stats
    assert stats["observation.image"]["mean"].shape == (3, 1, 1)
    for key, per_stat in expected.items():
        for name, want in per_stat.items():
            got = stats[key][name]
            assert got.dtype == torch.float32
            np.testing.assert_allclose(
                got.numpy().reshape(np.shape(want)), want, rtol=1e-5, atol=1e-6, err_msg=f"{key} {name}"
            )


# ------------------------------------------------------------------------------------- factory, loader


def _env_cfg() -> EnvConfig:
    return EnvConfig(
        name="pusht",
        fps=10,
        features={
            "observation.image": FeatureConfig(shape=[3, H, W], kind="visual"),
            "observation.state": FeatureConfig(shape=[2], kind="state"),
            "action": FeatureConfig(shape=[2], kind="action"),
        },
    )


def test_make_dataset_splits_by_episode_and_selects_env_features(fake, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    src, out, _ = fake
    cfg = DatasetConfig(root=str(src.parent), cache_dir=str(out.parents[1]), val_fraction=0.25, split_seed=3)
    train = make_dataset(cfg, _env_cfg(), {"action": [0.0, 0.1]})
    val = make_dataset(cfg, _env_cfg(), None, split="val", keys=["next.reward", "next.done"])
    assert train.keys == ["observation.image", "observation.state", "action"]
    assert val.keys == ["observation.image", "observation.state", "action", "next.reward", "next.done"]
    assert set(train.episodes.tolist()) | set(val.episodes.tolist()) == {0, 1, 2, 3}
    assert len(val.episodes) == 1 and not set(train.episodes.tolist()) & set(val.episodes.tolist())
    assert set(train[0]) >= {"action", "action_is_pad"}
    # Validation normalizes with the training statistics.
    for name in ("mean", "std"):
        torch.testing.assert_close(val.stats["action"][name], train.stats["action"][name])
    assert split_episodes(4, 0.25, 3) == (train.episodes.tolist(), val.episodes.tolist())
    assert split_episodes(206, 0.1, 0)[1] != split_episodes(206, 0.1, 1)[1]
    assert len(split_episodes(206, 0.1, 0)[1]) == 21


def test_make_dataset_rejects_mismatches(fake, monkeypatch):
    monkeypatch.delenv(DATA_ROOT_ENV, raising=False)
    src, out, _ = fake
    cfg = DatasetConfig(root=str(src.parent), cache_dir=str(out.parents[1]))
    env = _env_cfg()
    env.features["observation.state"] = FeatureConfig(shape=[3], kind="state")
    with pytest.raises(ConfigError, match=r"env.features.observation.state.shape=\[3\]"):
        make_dataset(cfg, env, None)
    pendulum = EnvConfig(name="pendulum", features={"observation.angle": FeatureConfig(shape=[1])})
    with pytest.raises(ConfigError, match=r"has no feature \['observation.angle'\]"):
        make_dataset(cfg, pendulum, None)
    with pytest.raises(ConfigError, match="dataset.format='nope' is unknown"):
        make_dataset(DatasetConfig(root=cfg.root, format="nope"), _env_cfg(), None)
    with pytest.raises(ConfigError, match="val_fraction > 0"):
        make_dataset(cfg, _env_cfg(), None, split="val")
    with pytest.raises(ConfigError, match="split='test'"):
        make_dataset(cfg, _env_cfg(), None, split="test")


def _indices(loader) -> list[list[int]]:
    return [batch["index"].tolist() for batch in loader]


def test_resumed_loader_replays_the_same_batches(fake):
    ds = EpisodeDataset(fake[1], keys=["action"])
    # 18 frames, batch 4, drop_last: 4 steps per epoch; 11 steps cross two epoch boundaries.
    full = _indices(make_dataloader(ds, 4, seed=5, num_steps=11))
    assert len(full) == 11 and all(len(b) == 4 for b in full)
    for k in (0, 3, 4, 9):
        assert _indices(make_dataloader(ds, 4, seed=5, start_step=k, num_steps=11 - k)) == full[k:]
    # Each epoch draws distinct items, epochs are shuffled differently, other seeds give other orders.
    for epoch in range(2):
        items = sum(full[4 * epoch : 4 * epoch + 4], [])
        assert len(set(items)) == 16
    assert full[:4] != full[4:8]
    assert _indices(make_dataloader(ds, 4, seed=6, num_steps=11)) != full
    # Default: exactly one epoch, like a plain DataLoader; the rest of the epoch when resuming mid-way.
    assert len(make_dataloader(ds, 4, seed=5)) == 4
    assert _indices(make_dataloader(ds, 4, seed=5, start_step=6)) == full[6:8]
    # The trainer's endless iterator gives the same steps.
    for k in (0, 7):
        batches = cycle_batches(ds, 4, seed=5, start_step=k)
        assert [next(batches)["index"].tolist() for _ in range(11 - k)] == full[k:]


def test_loader_order_is_independent_of_workers(fake):
    ds = EpisodeDataset(
        fake[1], delta_timestamps={"action": [0.0, 0.1]}, keys=["observation.image", "action"]
    )
    single = list(make_dataloader(ds, 5, num_workers=0, seed=1, drop_last=False, num_steps=6))
    multi = list(make_dataloader(ds, 5, num_workers=2, seed=1, drop_last=False, num_steps=6))
    assert [len(b["index"]) for b in single] == [5, 5, 5, 3, 5, 5]
    for a, b in zip(single, multi):
        assert a.keys() == b.keys()
        for key in a:
            torch.testing.assert_close(a[key], b[key])
    first_epoch = sum((b["index"].tolist() for b in single[:4]), [])
    assert sorted(first_epoch) == list(range(18))


def test_sampler_rejects_bad_sizes():
    with pytest.raises(ValueError, match="no full batch"):
        StepBatchSampler(3, 4, seed=0)
    with pytest.raises(ValueError, match="start_step"):
        StepBatchSampler(10, 2, seed=0, start_step=-1)


def test_dataset_pickles_without_array_copies(fake):
    import pickle

    ds = EpisodeDataset(fake[1], delta_timestamps={"action": [0.0, 0.1]})
    blob = pickle.dumps(ds)
    assert len(blob) < 20_000, "memory maps must be reopened, not pickled"
    clone = pickle.loads(blob)
    for key, value in ds[4].items():
        torch.testing.assert_close(clone[4][key], value)


def test_in_memory_equals_memory_mapped(fake):
    mapped = EpisodeDataset(fake[1], delta_timestamps={"action": [0.0, 0.1]})
    loaded = EpisodeDataset(fake[1], delta_timestamps={"action": [0.0, 0.1]}, in_memory=True)
    assert not isinstance(loaded._arrays["action"], np.memmap)
    for key, value in mapped.__getitems__([0, 7, 17]).items():
        torch.testing.assert_close(loaded.__getitems__([0, 7, 17])[key], value)


def test_properties(fake):
    ds = EpisodeDataset(fake[1], episodes=[2, 0], keys=["observation.image", "action"])
    assert ds.fps == 10 and ds.num_frames == 7 and ds.num_episodes == 2
    assert ds.features == {"observation.image": (3, H, W), "action": (2,)}
    assert ds.episode_ranges == [(0, 3), (3, 7)]
    assert ds.episodes.tolist() == [0, 2]
    with pytest.raises(ValueError, match=r"episodes must lie in \[0, 4\)"):
        EpisodeDataset(fake[1], episodes=[4])
    with pytest.raises(KeyError, match="no feature"):
        EpisodeDataset(fake[1], keys=["observation.depth"])
    assert os.path.basename(str(ds.root)) == "v1"
