"""Which MetaWorld camera and image size show reach-v3's goal, and what each costs in frames per second.

    python benchmarks/bench_metaworld_camera.py [--tasks reach-v3] [--cameras corner2 topview ...]
        [--sizes 48 64 84 96] [--seeds 20] [--probes 4] [--steps 40] [--blocks 5] [--no-other-tasks]
        [--other-sizes 48 96] [--other-seeds 10]

For each task, camera and image side (the project's env, `lerobot.envs.metaworld`, fast rendering, square
images as `env.gym_kwargs.width/height` give them):
- goal pixels: the same state rendered twice, with the goal site as MetaWorld draws it and with its alpha set
  to 0 (`model.site_rgba`); the pixels that differ (any channel) show the goal. At the reset of `--seeds`
  seeds (0, 1, ...): median and minimum, the share of seeds with at least 1 and 4 goal pixels. Along the
  scripted expert's episode of each seed (`--probes` + 1 frames evenly spaced from the reset to its success
  step): the share of frames that show the goal, the share with the goal inside the field of view, and the
  share where the arm hides it (judged on the native render: the goal's projected disk covers >= 4 pixels,
  fewer than half of them show).
- the image recipe's path, `96->48c44`: the 96x96 render resized to 48x48 as the policy resizes it (bilinear,
  antialiased) and center-cropped to 44x44 (configs/experiment/diffusion_metaworld_mt10_image_cpu.yaml);
  a pixel shows the goal when it differs by at least one level of 255 after rounding; `goal_contrast` sums
  the differences (in full-contrast pixels: max channel difference / 255), for every path.
- cost: env steps per second of `env.step` with the camera observation at that size (random actions,
  median of `--blocks` blocks of `--steps` steps, one thread; the settings' blocks interleaved), and with the
  state alone as the reference. The recipe's resize and crop run in the policy: its rows cost a 96 render.

The other MT10 tasks with a goal site (all but `--tasks`; `--no-other-tasks` skips them) get the reset frames
of `--other-seeds` seeds only, at `--other-sizes` (no expert episodes, no timing). About 5 minutes on one
busy core. Writes benchmarks/results/metaworld_camera.json.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings

import numpy as np
import torch
from common import print_table, save_results

from lerobot.envs.metaworld import TASK_SETS, MetaWorldEnv
from lerobot.policies.diffusion.vision import center_crop
from lerobot.policies.images import resize

# The cameras of MetaWorld 3.1.1's scene (metaworld/assets/objects/assets/xyz_base.xml): five fixed, two on
# the gripper (they move with the hand).
CAMERAS = ("corner", "corner2", "corner3", "corner4", "topview", "behindGripper", "gripperPOV")
SIZES = (48, 64, 84, 96)
# The image recipe: render 96, resize to 48, center-crop 44 (the crop evaluation uses).
RECIPE = (96, 48, 44)
RECIPE_PATH = f"{RECIPE[0]}->{RECIPE[1]}c{RECIPE[2]}"
GOAL_SITE = "goal"
EXPERT_MAX_STEPS = 300


def camera_env(task: str, camera: str, size: int) -> MetaWorldEnv:
    """The task's env, its state observations and `render()` the camera at `size` x `size`: the camera
    observation's own renderer (MetaWorld's, as `obs_type=pixels_agent_pos` renders), drawn only when asked."""
    return MetaWorldEnv(task=task, obs_type="state", camera=camera, render_size=size, render_mode="rgb_array")


def goal_renders(env: MetaWorldEnv) -> tuple[np.ndarray, np.ndarray]:
    """The current state rendered with the goal site as MetaWorld draws it and with the site invisible."""
    model = env._env.model
    site = model.site(GOAL_SITE).id
    alpha = float(model.site_rgba[site, 3])
    visible = env.render()
    model.site_rgba[site, 3] = 0.0
    try:
        hidden = env.render()
    finally:
        model.site_rgba[site, 3] = alpha
    return visible, hidden


def goal_projection(env: MetaWorldEnv) -> tuple[bool, float]:
    """Whether the goal site's centre lies in the camera's field of view, and the area in pixels of its
    projected sphere (0 outside): what the frame would show with nothing in front of it."""
    model, data = env._env.model, env._env.data
    cam, site = model.camera(env.camera).id, model.site(GOAL_SITE).id
    local = data.cam_xmat[cam].reshape(3, 3).T @ (data.site_xpos[site] - data.cam_xpos[cam])
    depth = -local[2]  # a camera looks down its -z axis
    if depth <= 0:
        return False, 0.0
    half = np.tan(np.deg2rad(model.cam_fovy[cam]) / 2) * depth  # half the view's side at that depth
    if max(abs(local[0]), abs(local[1])) > half:
        return False, 0.0
    radius_px = model.site_size[site, 0] / half * env.render_size / 2
    return True, float(np.pi * radius_px**2)


def recipe_image(image: np.ndarray) -> np.ndarray:
    """A 96x96 frame as the image recipe's policy sees it at evaluation: resized to 48x48 (bilinear,
    antialiased) and center-cropped to 44x44, in levels of 255 (float)."""
    x = torch.from_numpy(image).permute(2, 0, 1)[None].float()
    x = center_crop(resize(x, (RECIPE[1], RECIPE[1])), (RECIPE[2], RECIPE[2]))
    return x[0].permute(1, 2, 0).numpy()


def goal_pixels(visible: np.ndarray, hidden: np.ndarray) -> tuple[int, float]:
    """Pixels that show the goal (differ by at least one level of 255 after rounding, any channel) and the
    goal's contrast in full-contrast pixels (the sum of each pixel's largest channel difference / 255)."""
    diff = np.abs(np.round(visible.astype(np.float64)) - np.round(hidden.astype(np.float64))).max(-1)
    return int((diff >= 1).sum()), float(diff.sum() / 255)


def expert_actions(task: str, seed: int) -> list[np.ndarray]:
    """The scripted expert's actions of the task's episode `seed`, up to its success step."""
    from metaworld.policies import ENV_POLICY_MAP

    expert = ENV_POLICY_MAP[task]()
    env = MetaWorldEnv(task=task, obs_type="state")
    try:
        obs, _ = env.reset(seed=seed)
        actions = []
        for _ in range(EXPERT_MAX_STEPS):
            with warnings.catch_warnings():
                warnings.filterwarnings("ignore", message="Constant", category=UserWarning)
                action = np.clip(expert.get_action(obs["state"]), -1.0, 1.0).astype(np.float32)
            actions.append(action)
            obs, _, terminated, truncated, _ = env.step(action)
            if terminated or truncated:
                break
        return actions
    finally:
        env.close()


def _frame_stats(frames: list[dict], key: str) -> dict:
    """Goal pixel statistics over reset frames (`frames`: one dict per frame)."""
    px = [f[key] for f in frames]
    return {
        "goal_px_median": float(statistics.median(px)),
        "goal_px_min": int(min(px)),
        "share_ge1": sum(p >= 1 for p in px) / len(px),
        "share_ge4": sum(p >= 4 for p in px) / len(px),
        "goal_contrast_median": float(statistics.median(f[key + "_contrast"] for f in frames)),
    }


def measure_visibility(
    task: str,
    camera: str,
    size: int,
    seeds: list[int],
    probes: int = 4,
    trajectories: dict[int, list[np.ndarray]] | None = None,
) -> list[dict]:
    """Goal visibility of `task` from `camera` at `size` over the reset of each seed and, with
    `trajectories` (seed -> the expert's actions), `probes` + 1 frames along each expert episode.

    One row per image path: `native` (the render at `size`) and, for a 96 render, the image recipe's
    `96->48c44`. Each row carries `reset_px` (the goal pixels of each seed's reset frame, in seed order)."""
    recipe = size == RECIPE[0]
    env = camera_env(task, camera, size)
    frames: list[dict] = []  # reset frames
    episode: list[dict] = []  # frames along the expert's episodes (the reset frame included)
    try:
        for seed in seeds:
            env.reset(seed=seed)
            actions = (trajectories or {}).get(seed)
            marks = sorted({round(i * len(actions) / probes) for i in range(probes + 1)}) if actions else [0]
            for step in range(max(marks) + 1):
                if step in marks:
                    visible, hidden = goal_renders(env)
                    in_view, expected = goal_projection(env)
                    px, contrast = goal_pixels(visible, hidden)
                    frame = {"native": px, "native_contrast": contrast, "in_view": in_view}
                    frame["occluded"] = expected >= 4 and px < expected / 2
                    frame["judged"] = expected >= 4
                    if recipe:
                        px, contrast = goal_pixels(recipe_image(visible), recipe_image(hidden))
                        frame.update({"recipe": px, "recipe_contrast": contrast})
                    if step == 0:
                        frames.append(frame)
                    episode.append(frame)
                if actions and step < len(actions):
                    env.step(actions[step])
    finally:
        env.close()
    rows = []
    for path, key, side in [("native", "native", size)] + (
        [(RECIPE_PATH, "recipe", RECIPE[2])] if recipe else []
    ):
        row = {"task": task, "camera": camera, "size": size, "path": path, "image_side": side}
        row.update(_frame_stats(frames, key))
        row["reset_px"] = [f[key] for f in frames]
        if trajectories:
            judged = [f for f in episode if f["judged"]]
            row.update(
                {
                    "episode_frames": len(episode),
                    "episode_share_ge1": sum(f[key] >= 1 for f in episode) / len(episode),
                    "episode_in_view": sum(f["in_view"] for f in episode) / len(episode),
                    "episode_occluded": (sum(f["occluded"] for f in judged) / len(judged))
                    if judged
                    else None,
                }
            )
        rows.append(row)
    return rows


def steps_per_s(
    task: str, configs: list[tuple[str | None, int]], steps: int, blocks: int, seed: int = 0
) -> dict[tuple[str | None, int], float]:
    """Median env steps per second of `env.step` for each (camera, size) of `configs` over `blocks` blocks of
    `steps` random actions: with the camera observation at size x size (`obs_type=pixels_agent_pos`), or the
    state alone (camera None). The envs live side by side and take their blocks in turns (one block each per
    round, the order rotated every round), so that a busy machine's load falls on all of them alike."""
    envs = {}
    try:
        for camera, size in configs:
            if camera is None:
                env = MetaWorldEnv(task=task, obs_type="state")
            else:
                env = MetaWorldEnv(
                    task=task, obs_type="pixels_agent_pos", camera=camera, width=size, height=size
                )
            env.reset(seed=seed)
            env.step(np.zeros(4, dtype=np.float32))  # warm-up (the first render makes the GL context)
            envs[camera, size] = env
        rng = np.random.default_rng(seed)
        rates: dict[tuple[str | None, int], list[float]] = {key: [] for key in envs}
        keys = list(envs)
        for block in range(blocks):
            for key in keys[block % len(keys) :] + keys[: block % len(keys)]:
                env = envs[key]
                if key[0] is not None:
                    # MetaWorld's renderer draws in whatever OpenGL context is current: make it its own.
                    env._env.mujoco_renderer.viewer.make_context_current()
                actions = rng.uniform(-1, 1, size=(steps, 4)).astype(np.float32)
                start = time.perf_counter()
                for action in actions:
                    _, _, terminated, truncated, _ = env.step(action)
                    if terminated or truncated:
                        env.reset(seed=seed)
                rates[key].append(steps / (time.perf_counter() - start))
        return {key: float(statistics.median(values)) for key, values in rates.items()}
    finally:
        for env in envs.values():
            env.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", nargs="+", default=["reach-v3"], help="tasks measured in full")
    parser.add_argument("--cameras", nargs="+", default=list(CAMERAS))
    parser.add_argument("--sizes", type=int, nargs="+", default=list(SIZES))
    parser.add_argument("--seeds", type=int, default=20, help="reset seeds 0..N-1")
    parser.add_argument(
        "--probes", type=int, default=4, help="frames along each expert episode, plus the reset"
    )
    parser.add_argument("--steps", type=int, default=40, help="env steps per timed block")
    parser.add_argument("--blocks", type=int, default=5, help="timed blocks per setting (the median is kept)")
    parser.add_argument("--other-tasks", action=argparse.BooleanOptionalAction, default=True)
    parser.add_argument("--other-sizes", type=int, nargs="+", default=[48, RECIPE[0]])
    parser.add_argument("--other-seeds", type=int, default=10)
    args = parser.parse_args()
    torch.set_num_threads(1)
    seeds = list(range(args.seeds))
    rows: list[dict] = []
    state_fps: dict[str, float] = {}
    for task in args.tasks:
        trajectories = {seed: expert_actions(task, seed) for seed in seeds}
        configs = [(None, 0)] + [(camera, size) for camera in args.cameras for size in args.sizes]
        fps = steps_per_s(task, configs, args.steps, args.blocks)
        state_fps[task] = fps[None, 0]
        for camera in args.cameras:
            for size in args.sizes:
                for row in measure_visibility(task, camera, size, seeds, args.probes, trajectories):
                    row.update({"steps_per_s": fps[camera, size], "state_steps_per_s": state_fps[task]})
                    rows.append(row)
                    print_table([rows[-1]], COLUMNS)
    others: list[dict] = []
    if args.other_tasks:
        for task in TASK_SETS["mt10"]:
            if task in args.tasks:
                continue
            probe = MetaWorldEnv(task=task, obs_type="state")
            probe.reset(seed=0)
            has_goal = GOAL_SITE in [probe._env.model.site(i).name for i in range(probe._env.model.nsite)]
            probe.close()
            if not has_goal:
                others.append({"task": task, "camera": None, "goal_site": False})
                continue
            for camera in args.cameras:
                for size in args.other_sizes:
                    others += measure_visibility(task, camera, size, list(range(args.other_seeds)))
    print()
    print_table(rows, COLUMNS)
    if others:
        print()
        print_table(others, OTHER_COLUMNS)
    save_results(
        "metaworld_camera",
        rows,
        {
            "settings": {
                "seeds": seeds,
                "other_seeds": args.other_seeds,
                "probes": args.probes,
                "steps": args.steps,
                "blocks": args.blocks,
                "fast_render": True,
                "recipe": RECIPE_PATH,
                "threads": 1,
            },
            "state_steps_per_s": state_fps,
            "other_tasks": others,
        },
    )


COLUMNS = [
    "task",
    "camera",
    "path",
    "image_side",
    "goal_px_median",
    "goal_px_min",
    "share_ge1",
    "share_ge4",
    "goal_contrast_median",
    "episode_share_ge1",
    "episode_in_view",
    "episode_occluded",
    "steps_per_s",
]
OTHER_COLUMNS = COLUMNS[: COLUMNS.index("share_ge4") + 1]  # reset frames only: no episodes, no timing

if __name__ == "__main__":
    main()
