"""MetaWorld (Farama `metaworld` 3.x, MuJoCo) as an env of this framework: one env that runs any task of a
task set, the task chosen by the reset seed.

`gym_id: lerobot.envs.metaworld:MetaWorld-v0` (registered on import), with `gym_kwargs`:
- `task`: one task (`pick-place-v3`), a named set (`mt10`, `mt50`, `easy`, `medium`, `hard`, `very_hard`) or
  a list of these; `task_names(task)` resolves it (the `env.task` setting, see `lerobot.config.EnvConfig`).
- `obs_type`: `state` (the 39-dim vector) or `pixels_agent_pos` (a camera image plus the 4-dim agent state:
  hand position and gripper opening, as LeRobot's MetaWorld env gives).
- `camera`, `width`, `height`: the camera image (`corner2` by default, LeRobot's; `env=metaworld_pixels` uses
  `corner4`), turned right side up where MetaWorld renders it rotated by 180 degrees (corner2, corner4).
- `render_size`: the side of the frames `render()` gives (evaluation videos), from the same camera, 256 px
  by default, whatever the size of the camera observation; videos play at MetaWorld's control rate, 80 fps
  (`CONTROL_FPS`) over `action_repeat`.
- `fast_render`: shadows and multisampling off, set before the first render (about 10x faster on a CPU
  renderer; edges are aliased and objects cast no shadow). `false` renders MetaWorld's full-quality scene.
- `terminate_on_success`: the episode ends at its first successful step (scripted demonstrations stop
  there; success, "the flag ever set within the horizon", is the same either way).
- `action_repeat`: MetaWorld steps per env step, the action held and the rewards summed (TD-MPC's protocol
  uses 2 with 100-step episodes); success if any of them succeeded. 1 by default.

What this fixes in the package: the goal is observable (MetaWorld's multi-task protocol), the observation
space declares bounds that hold (MetaWorld's own declares the goal dims as exactly 0), `info["is_success"]`
is the success flag the rollout reads, and a reset seed reproduces the task's goal and initial state.

Every env observation carries `task_index`, the task's index in `ALL_TASKS` (the 50 task names in sorted
order, the same vocabulary as the `names` of the env YAML's `observation.task_index` feature), so that a
multi-task policy reads its task from the batch.

A reset seed carries the episode's task: `seed = position * TASK_SEED_STRIDE + episode_seed`, where
`position` indexes `task_names(task)` (see `lerobot.envs.tasks`). One env holds one MuJoCo model at a time
and builds the next task's model when a reset asks for another task, so memory grows with env slots, never
with tasks. This module stays torch-free: async env workers import it.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from lerobot.envs.rendering import check_gl, gl_failure, gl_for_import, load_before_gl
from lerobot.envs.tasks import split_task_seed, task_seed
from lerobot.errors import ConfigError

# mujoco reads MUJOCO_GL when metaworld imports it: a headless backend unless the user picked one, and no
# rendering at all when the user's cannot work here (a state-only run needs none).
try:
    with gl_for_import():
        import metaworld  # noqa: F401 - registers nothing we use, but fails early and clearly when missing
        import mujoco
        from metaworld.env_dict import ALL_V3_ENVIRONMENTS, ML1_ARGS_KWARGS, MT10_V3
except ImportError as e:  # pragma: no cover - exercised only without the extra
    raise ImportError(
        "MetaWorld envs need the `metaworld` package: pip install -e '.[mujoco]' (pins metaworld==3.1.1 "
        "with mujoco==3.3.0)"
    ) from e

# A `module:Name` gym id: gymnasium imports this module (which registers `Name`) in every worker.
GYM_ID = "lerobot.envs.metaworld:MetaWorld-v0"
_REGISTERED_ID = GYM_ID.split(":")[1]
ALL_TASKS: list[str] = sorted(ALL_V3_ENVIRONMENTS)
OBS_TYPES = ("state", "pixels_agent_pos")
STATE_DIM = 39
# MetaWorld's control rate: an env step is 5 MuJoCo steps (frame_skip) of 2.5 ms (the models' timestep).
CONTROL_FPS = 80
AGENT_POS_DIM = 4
# The scene's cameras that render upside down (rotated by 180 degrees): frames are turned back (`_upright`).
_ROTATED_CAMERAS = ("corner2", "corner4")

# The difficulty groups of Seo et al. 2022 (Masked World Models), as LeRobot names them.
_DIFFICULTY = {
    "easy": (
        "button-press-v3 button-press-topdown-v3 button-press-topdown-wall-v3 button-press-wall-v3 "
        "coffee-button-v3 dial-turn-v3 door-close-v3 door-lock-v3 door-open-v3 door-unlock-v3 "
        "drawer-close-v3 drawer-open-v3 faucet-close-v3 faucet-open-v3 handle-press-v3 handle-press-side-v3 "
        "handle-pull-v3 handle-pull-side-v3 lever-pull-v3 plate-slide-v3 plate-slide-back-v3 "
        "plate-slide-back-side-v3 plate-slide-side-v3 reach-v3 reach-wall-v3 window-close-v3 "
        "window-open-v3 peg-unplug-side-v3"
    ),
    "medium": (
        "basketball-v3 bin-picking-v3 box-close-v3 coffee-pull-v3 coffee-push-v3 hammer-v3 "
        "peg-insert-side-v3 push-wall-v3 soccer-v3 sweep-v3 sweep-into-v3"
    ),
    "hard": "assembly-v3 hand-insert-v3 pick-out-of-hole-v3 pick-place-v3 push-v3 push-back-v3",
    "very_hard": "shelf-place-v3 disassemble-v3 stick-pull-v3 stick-push-v3 pick-place-wall-v3",
}
TASK_SETS: dict[str, list[str]] = {
    "mt10": list(MT10_V3),
    "mt50": ALL_TASKS,
    **{name: names.split() for name, names in _DIFFICULTY.items()},
}


def task_names(task: str | list[str] | tuple[str, ...]) -> list[str]:
    """The tasks that `task` names, in order without repeats: one task, a set of `TASK_SETS`, or a list of
    either (`[reach-v3, drawer-close-v3]`, `[easy, hard]`)."""
    items = [task] if isinstance(task, str) else list(task)
    names: list[str] = []
    for item in items:
        item = str(item)
        if item in TASK_SETS:
            found = TASK_SETS[item]
        elif item in ALL_V3_ENVIRONMENTS:
            found = [item]
        else:
            raise ConfigError(
                f"env.task: unknown MetaWorld task or set {item!r}; use a task name (e.g. pick-place-v3; all "
                f"50: {', '.join(ALL_TASKS)}) or a set ({', '.join(TASK_SETS)})"
            )
        names += [name for name in found if name not in names]
    if not names:
        raise ConfigError("env.task names no MetaWorld task; e.g. env.task=pick-place-v3 or env.task=mt10")
    return names


def _hand_bounds() -> tuple[np.ndarray, np.ndarray]:
    hand = next(iter(ALL_V3_ENVIRONMENTS.values()))._HAND_SPACE
    return hand.low.astype(np.float64), hand.high.astype(np.float64)


class MetaWorldEnv(gym.Env):
    """Any task of a MetaWorld task set, chosen by the reset seed (see the module docstring)."""

    # What evaluation calls to list the tasks of `env.task` (see `lerobot.envs.factory.env_task_names`).
    task_names = staticmethod(task_names)
    metadata = {"render_modes": ["rgb_array"], "render_fps": CONTROL_FPS}

    def __init__(
        self,
        task: str | list[str] = "mt10",
        obs_type: str = "state",
        camera: str = "corner2",
        width: int = 96,
        height: int = 96,
        fast_render: bool = True,
        terminate_on_success: bool = True,
        action_repeat: int = 1,
        render_size: int = 256,
        render_mode: str | None = None,
    ):
        if obs_type not in OBS_TYPES:
            raise ConfigError(f"env.gym_kwargs.obs_type={obs_type!r}: expected one of {OBS_TYPES}")
        if action_repeat < 1:
            raise ConfigError(f"env.gym_kwargs.action_repeat={action_repeat} must be >= 1")
        if render_size < 1:
            raise ConfigError(f"env.gym_kwargs.render_size={render_size} must be >= 1")
        self.action_repeat, self.render_size = int(action_repeat), int(render_size)
        # Videos play in real time: one frame per env step.
        self.metadata = {**self.metadata, "render_fps": round(CONTROL_FPS / self.action_repeat)}
        self.tasks = task_names(task)
        self.obs_type, self.camera = obs_type, camera
        self.width, self.height = int(width), int(height)
        self.fast_render, self.terminate_on_success = fast_render, terminate_on_success
        self.render_mode = render_mode
        self._renders = obs_type != "state" or render_mode is not None
        self._env: Any = None  # the current task's MetaWorld env
        # Pixel observations of another size than the videos': the videos' own renderer (made at the first
        # `render()`, with an OpenGL context of its own).
        self._video: mujoco.Renderer | None = None
        self._task: str | None = None
        self._task_index = np.zeros((), dtype=np.int64)

        hand_low, hand_high = _hand_bounds()
        # Hand position and gripper opening are bounded; object poses, the previous frame's object poses
        # and the goal are not (MetaWorld declares the goal as exactly 0, which the observable goal is not).
        low = np.full(STATE_DIM, -np.inf)
        high = np.full(STATE_DIM, np.inf)
        for start in (0, 18):
            low[start : start + 3], high[start : start + 3] = hand_low, hand_high
            low[start + 3], high[start + 3] = -1.0, 1.0
        task_space = spaces.Box(0, len(ALL_TASKS) - 1, shape=(), dtype=np.int64)
        agent_space = spaces.Box(low[:AGENT_POS_DIM], high[:AGENT_POS_DIM], dtype=np.float64)
        if obs_type == "state":
            self.observation_space = spaces.Dict(
                {
                    "state": spaces.Box(low, high, dtype=np.float64),
                    "agent_pos": agent_space,
                    "task_index": task_space,
                }
            )
        else:
            # The full state too, for a scripted expert recording pixel demonstrations (env=metaworld_pixels_expert
            # maps it; env=metaworld_pixels leaves it out, so pixel policies never see it).
            self.observation_space = spaces.Dict(
                {
                    "pixels": spaces.Box(0, 255, shape=(self.height, self.width, 3), dtype=np.uint8),
                    "agent_pos": agent_space,
                    "task_index": task_space,
                    "state": spaces.Box(low, high, dtype=np.float64),
                }
            )
        self.action_space = spaces.Box(-1.0, 1.0, shape=(4,), dtype=np.float32)

    @property
    def task(self) -> str | None:
        """The task of the current episode (None before the first reset)."""
        return self._task

    def _use_task(self, name: str) -> None:
        """Make `name` the current task, building its MuJoCo model (and closing the previous one)."""
        if name == self._task:
            return
        self.close()
        if self._renders:
            load_before_gl()
        # MetaWorld's own renderer makes the camera observation; in state mode only videos, at their size.
        pixels = self.obs_type != "state"
        env = ALL_V3_ENVIRONMENTS[name](
            render_mode="rgb_array" if self._renders else None,
            camera_name=self.camera if self._renders else None,
            width=self.width if pixels else self.render_size,
            height=self.height if pixels else self.render_size,
        )
        kwargs = {k: v for k, v in ML1_ARGS_KWARGS[name]["kwargs"].items() if k != "task_id"}
        env._set_task_inner(**kwargs)
        env._set_task_called = True
        # Goal observable, as MetaWorld's multi-task benchmarks set it; the cached space follows the flag.
        if env._partially_observable:
            env._partially_observable = False
            env.__dict__.pop("sawyer_observation_space", None)
        # Goals and initial positions drawn from the env's own seeded generator at every reset.
        env._freeze_rand_vec = False
        env.seeded_rand_vec = True
        if self.fast_render:
            env.model.light_castshadow[:] = 0
            env.model.vis.quality.offsamples = 0
        self._env, self._task = env, name
        self._task_index[()] = ALL_TASKS.index(name)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None):
        """Start an episode of the task and initial state that `seed` names (a random one without a seed)."""
        super().reset(seed=seed)
        if seed is None:
            seed = task_seed(
                int(self.np_random.integers(len(self.tasks))), int(self.np_random.integers(2**31))
            )
        position, episode_seed = split_task_seed(seed)
        if position >= len(self.tasks):
            raise ValueError(
                f"reset seed {seed} names task {position} of a task set of {len(self.tasks)} ({self.tasks})"
            )
        self._use_task(self.tasks[position])
        self._env.seed(episode_seed)
        state, _ = self._env.reset()
        return self._observation(state), {"task": self._task}

    def step(self, action: np.ndarray):
        """`action_repeat` MetaWorld steps with `action`; the rewards summed, `info["is_success"]` whether
        MetaWorld's success flag was set at any of them."""
        action = np.asarray(action, dtype=np.float32)
        total, success = 0.0, False
        for _ in range(self.action_repeat):
            state, reward, _, truncated, info = self._env.step(action)
            total += float(reward)
            success = success or bool(info["success"])
            if truncated or (success and self.terminate_on_success):
                break
        info = {**info, "is_success": success, "task": self._task}
        return self._observation(state), total, success and self.terminate_on_success, truncated, info

    def _observation(self, state: np.ndarray) -> dict[str, np.ndarray]:
        task_index = self._task_index.copy()
        agent_pos = state[:AGENT_POS_DIM].astype(np.float64)
        if self.obs_type == "state":
            return {"state": state.astype(np.float64), "agent_pos": agent_pos, "task_index": task_index}
        return {
            "pixels": self._camera_image(),
            "agent_pos": agent_pos,
            "task_index": task_index,
            "state": state.astype(np.float64),
        }

    def render(self) -> np.ndarray:
        """The video frame (render_size, render_size, 3) uint8 of the camera, right side up."""
        if self._env is None:
            raise RuntimeError("render() before the first reset()")
        if self.obs_type == "state" or (self.height, self.width) == (self.render_size, self.render_size):
            return self._camera_image()
        check_gl()
        try:
            if self._video is None:
                model = self._env.model
                # The offscreen buffer must hold the frame (MetaWorld's models declare 640x480).
                model.vis.global_.offwidth = max(model.vis.global_.offwidth, self.render_size)
                model.vis.global_.offheight = max(model.vis.global_.offheight, self.render_size)
                self._video = mujoco.Renderer(model, self.render_size, self.render_size)
            self._video.update_scene(self._env.data, camera=self.camera)
            return self._upright(self._video.render())  # its context is made current here
        except Exception as e:  # MuJoCo's renders fail only where its OpenGL context cannot be made
            raise gl_failure(e) from e

    def _camera_image(self) -> np.ndarray:
        """MetaWorld's own render (the camera observation; in state mode the video frame), right side up."""
        check_gl()
        try:
            viewer = self._env.mujoco_renderer.viewer
            if viewer is not None:
                # gymnasium's offscreen viewer renders into whichever OpenGL context is current: another env
                # of this process (a sync vector env's next slot) or the videos' renderer may have made its
                # own current since, and this env's frame would be read from that one's buffer.
                viewer.make_context_current()
            image = self._env.render()
        except Exception as e:  # MuJoCo's renders fail only where its OpenGL context cannot be made
            raise gl_failure(e) from e
        return self._upright(image)

    def _upright(self, image: np.ndarray) -> np.ndarray:
        """A frame of the camera right side up (MetaWorld's corner2 and corner4 render rotated by 180 degrees)."""
        if self.camera in _ROTATED_CAMERAS:
            image = image[::-1, ::-1]
        return np.ascontiguousarray(image)

    def close(self) -> None:
        """Free the current task's model and both renderers' OpenGL contexts."""
        if self._video is not None:
            self._video.close()
            self._video = None
        if self._env is not None:
            self._env.close()
            self._env = None
            self._task = None


if _REGISTERED_ID not in gym.registry:
    gym.register(_REGISTERED_ID, entry_point=MetaWorldEnv, max_episode_steps=500)
