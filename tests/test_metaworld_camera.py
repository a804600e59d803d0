"""The MetaWorld camera benchmark (benchmarks/bench_metaworld_camera.py): goal pixels are those that differ
between a render with reach-v3's goal site and one with the site made invisible, and its rows carry the
fields the docs' table reads. Renders offscreen (EGL or OSMesa); skipped where MuJoCo cannot render."""

import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("metaworld", reason="MetaWorld envs need the [mujoco] extra (metaworld==3.1.1)")

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))
import bench_metaworld_camera as bench  # noqa: E402

from lerobot.errors import RenderingError  # noqa: E402

SEEDS = [0, 1]


def _goal_renders(camera: str, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """reach-v3 seed 0 rendered with and without its goal site, and the site's colour afterwards."""
    env = bench.camera_env("reach-v3", camera, size)
    try:
        env.reset(seed=0)
        try:
            visible, hidden = bench.goal_renders(env)
        except RenderingError as e:
            pytest.skip(f"MuJoCo cannot render here: {e}")
        model = env._env.model
        return visible, hidden, model.site_rgba[model.site(bench.GOAL_SITE).id].copy()
    finally:
        env.close()


def test_goal_site_shows_from_topview_and_is_restored():
    visible, hidden, rgba = _goal_renders("topview", 48)
    assert visible.shape == hidden.shape == (48, 48, 3) and visible.dtype == np.uint8
    assert (visible != hidden).any()  # the goal shows from above
    px, contrast = bench.goal_pixels(visible, hidden)
    assert px >= 1 and contrast > 0
    assert rgba[3] == 1.0  # the site is drawn again after the hidden render


def test_measurement_rows_have_the_table_fields():
    _goal_renders("topview", 48)  # skips where MuJoCo cannot render
    trajectories = {seed: bench.expert_actions("reach-v3", seed) for seed in SEEDS}
    assert all(0 < len(actions) < bench.EXPERT_MAX_STEPS for actions in trajectories.values())
    (row,) = bench.measure_visibility("reach-v3", "topview", 48, SEEDS, probes=2, trajectories=trajectories)
    assert (row["task"], row["camera"], row["path"], row["image_side"]) == (
        "reach-v3",
        "topview",
        "native",
        48,
    )
    assert len(row["reset_px"]) == len(SEEDS) and row["goal_px_min"] == min(row["reset_px"]) >= 1
    assert row["share_ge1"] == 1.0 and 0 <= row["share_ge4"] <= 1
    assert row["episode_frames"] == 3 * len(SEEDS) and row["episode_in_view"] == 1.0
    assert 0 < row["episode_share_ge1"] <= 1
    # The recipe's path: a 96 render resized to 48 and center-cropped to 44.
    assert bench.recipe_image(np.zeros((96, 96, 3), np.uint8)).shape == (44, 44, 3)
    rates = bench.steps_per_s("reach-v3", [(None, 0), ("topview", 48)], steps=5, blocks=1)
    assert set(rates) == {(None, 0), ("topview", 48)} and all(r > 0 for r in rates.values())
