"""DeepMind Control Suite tasks from state or pixels as gymnasium envs, with TD-MPC's (and DrQ's) protocol.

`gymnasium.make("lerobot.envs.dmc:lerobot/DMC-v0", domain="cartpole", task="swingup", action_repeat=2)` builds
one task (the `module:` prefix imports this module, which registers the id); `configs/env/dmc_<domain>_<task>.yaml`
name the tasks for `env=...`. What this module fixes or decides,
where dm_control's own `suite.load` does not fit a gymnasium env:

- Observation: dm_control returns a dict of arrays (some of them scalars, e.g. walker's `height`); here it is
  one float32 vector, the dict's entries flattened and concatenated in the order of the task's observation
  spec (`DMCEnv.observation_layout` names the slices), the state TD-MPC and TD-MPC2 feed their encoder.
  The space is unbounded, as the physics is.
- From pixels (`obs_type="pixels"`, DrQ's and PlaNet's setting): the observation is the last `frame_stack`
  frames of `camera_id` at `image_size` x `image_size`, stacked on the channels, (size, size, 3 x
  frame_stack) uint8, oldest first; a reset fills the stack with its first frame. One frame alone shows no
  velocity; three do.
- Action repeat: one `step` applies the action for `action_repeat` control steps and returns the sum of
  their rewards (TD-MPC2: 2 for every DMC task); `metadata["render_fps"]` is 1 / (control timestep x repeat).
- Episodes: every suite task used here runs 1,000 control steps, i.e. 500 agent steps at repeat 2, and then
  reports a time limit: `truncated`, never `terminated` (no suite task used here ends an episode early;
  one that ended it with discount 0 would read `terminated`). The configs also set
  `max_episode_steps: 500`, which gymnasium's time limit enforces at the same step.
- Seeds: `reset(seed=s)` reseeds the task's random state (the one dm_control draws initial states from) with
  `s`, so a seed always gives the same initial state; `reset()` without a seed goes on drawing from it.
- Rendering (`render_mode="rgb_array"`): `render_size` x `render_size` frames from `camera_id`, with shadows
  and multisampling off (several times cheaper on a CPU; 64 px frames took 2-3 ms against 19-26 ms with
  them). dm_control picks its OpenGL backend when first imported from `MUJOCO_GL`; unset, it is set here
  to `egl` when libEGL is found, else `osmesa` when libOSMesa is, so that a machine without a display
  renders headless. Rendering is optional: the state envs never render unless asked, and need no usable
  `MUJOCO_GL` until they do (`lerobot.envs.rendering`: a first render under one that cannot work is one
  line naming it and the backend that works).

dm_control is imported when the first env is built, so this module (and the id it registers) imports
without it; building an env without it raises `ConfigError` naming the install command.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium import spaces

from lerobot.envs.rendering import check_gl, gl_failure, gl_for_import, load_before_gl
from lerobot.errors import ConfigError

# The id as registered, and as configs name it: gymnasium's `module:id` form imports this module first
# (`lerobot.envs.worker.env_module`), as an async worker building the env must.
GYM_ID = "lerobot/DMC-v0"
CONFIG_GYM_ID = f"{__name__}:{GYM_ID}"
INSTALL_HINT = "pip install 'lerobot[mujoco]' (dm-control==1.0.28 with mujoco==3.3.0)"
# Names TD-MPC's task list uses for suite domains (`cup-catch` is the suite's `ball_in_cup`).
DOMAIN_ALIASES = {"cup": "ball_in_cup", "pointmass": "point_mass"}
# The suite's default camera 0 is a tracking view for every domain except quadruped's (TD-MPC2 uses 2 there).
_DEFAULT_CAMERA = {"quadruped": 2}
# reset() seeds numpy's legacy RandomState, which takes 32-bit seeds.
_MAX_SEED = 2**32
OBS_TYPES = ("state", "pixels")


def _load_suite():
    """dm_control's `suite` module, or a `ConfigError` saying how to install it."""
    try:
        # dm_control reads MUJOCO_GL when first imported: a value the user exported wins, unless it cannot
        # work here (then nothing renders: a state-only run needs nothing).
        with gl_for_import():
            load_before_gl()  # dm_control opens the headless display when imported
            from dm_control import suite
    except ImportError as e:
        raise ConfigError(f"DeepMind Control envs need dm_control ({e}): {INSTALL_HINT}") from None
    return suite


class DMCEnv(gym.Env):
    """One DeepMind Control Suite task from state or pixels, with repeated actions.

    Args:
        domain: suite domain (`cartpole`, `walker`, `ball_in_cup` or its alias `cup`, ...).
        task: the domain's task (`swingup`, `walk`, `catch`, ...).
        action_repeat: control steps per `step` (>= 1); rewards are summed over them.
        render_mode: None or "rgb_array".
        render_size: height and width of rendered frames (evaluation videos), pixels.
        camera_id: the camera of `render` and of pixel observations; None: the domain's usual tracking camera.
        obs_type: "state" (the flat state vector) or "pixels" (the stacked camera frames).
        image_size: height and width of a pixel observation's frames (DrQ: 84).
        frame_stack: how many of the latest frames a pixel observation holds (DrQ: 3).

    Shapes: observation (obs_dim,) float32 from state, (image_size, image_size, 3 * frame_stack) uint8 from
    pixels; action (action_dim,) within the task's action spec bounds (float32); `render()` (render_size,
    render_size, 3) uint8.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 50}

    def __init__(
        self,
        domain: str,
        task: str,
        action_repeat: int = 2,
        render_mode: str | None = None,
        render_size: int = 256,
        camera_id: int | None = None,
        obs_type: str = "state",
        image_size: int = 84,
        frame_stack: int = 3,
    ):
        suite = _load_suite()
        domain = DOMAIN_ALIASES.get(domain, domain)
        if (domain, task) not in suite.ALL_TASKS:
            known = ", ".join(f"{d}/{t}" for d, t in sorted(suite.ALL_TASKS))
            raise ConfigError(
                f"env.gym_kwargs: no DeepMind Control task {domain}/{task}; the suite has {known}"
            )
        if action_repeat < 1:
            raise ConfigError(f"env.gym_kwargs.action_repeat={action_repeat} must be >= 1")
        if render_mode not in (None, "rgb_array"):
            raise ConfigError(
                f"render_mode={render_mode!r}: DeepMind Control envs render 'rgb_array' or None"
            )
        if render_size < 1:
            raise ConfigError(f"env.gym_kwargs.render_size={render_size} must be >= 1")
        if obs_type not in OBS_TYPES:
            raise ConfigError(f"env.gym_kwargs.obs_type={obs_type!r}: choose one of {', '.join(OBS_TYPES)}")
        if image_size < 1 or frame_stack < 1:
            raise ConfigError(
                f"env.gym_kwargs.image_size={image_size} and frame_stack={frame_stack} must be >= 1"
            )
        self.obs_type, self.image_size, self.frame_stack = obs_type, image_size, frame_stack
        self._frames: deque[np.ndarray] = deque(maxlen=frame_stack)
        self.domain, self.task, self.action_repeat = domain, task, action_repeat
        self.render_mode, self.render_size = render_mode, render_size
        self.camera_id = _DEFAULT_CAMERA.get(domain, 0) if camera_id is None else camera_id
        # The task draws initial states from this RandomState; reset(seed) reseeds it in place.
        self._task_random = np.random.RandomState()
        self.dm_env = suite.load(domain, task, task_kwargs={"random": self._task_random})
        quality = self.dm_env.physics.model.vis.quality
        quality.shadowsize, quality.offsamples = 0, 0  # read when the first render creates the GL context

        self.observation_layout: list[tuple[str, slice]] = []
        start = 0
        for name, spec in self.dm_env.observation_spec().items():
            size = int(np.prod(spec.shape))
            self.observation_layout.append((name, slice(start, start + size)))
            start += size
        if obs_type == "pixels":
            shape = (image_size, image_size, 3 * frame_stack)
            self.observation_space = spaces.Box(0, 255, shape=shape, dtype=np.uint8)
        else:
            self.observation_space = spaces.Box(-np.inf, np.inf, shape=(start,), dtype=np.float32)
        action_spec = self.dm_env.action_spec()
        self.action_space = spaces.Box(
            action_spec.minimum.astype(np.float32), action_spec.maximum.astype(np.float32), dtype=np.float32
        )
        self.control_timestep = float(self.dm_env.control_timestep())
        self.metadata = {**self.metadata, "render_fps": round(1.0 / (self.control_timestep * action_repeat))}
        self._needs_reset = True

    def _flatten(self, observation: dict[str, Any]) -> np.ndarray:
        """The observation dict as one (obs_dim,) float32 vector, in `observation_layout` order."""
        return np.concatenate(
            [
                np.asarray(observation[name], dtype=np.float32).reshape(-1)
                for name, _ in self.observation_layout
            ]
        )

    def _observe(self, observation: dict[str, Any], first: bool = False) -> np.ndarray:
        """This step's observation: the flat state, or the frame stack with this step's frame added (on the
        first step of an episode, `first`, filling the whole stack)."""
        if self.obs_type == "state":
            return self._flatten(observation)
        frame = self._render(self.image_size)
        for _ in range(self.frame_stack if first else 1):
            self._frames.append(frame)
        return np.concatenate(self._frames, axis=-1)

    def _render(self, size: int) -> np.ndarray:
        """The camera's current frame, (size, size, 3) uint8."""
        check_gl()
        try:
            return self.dm_env.physics.render(size, size, camera_id=self.camera_id)
        except Exception as e:  # MuJoCo's renders fail only where its OpenGL context cannot be made
            raise gl_failure(e) from e

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple[np.ndarray, dict]:
        """Start an episode; with `seed`, from the initial state that seed always gives."""
        super().reset(seed=seed)
        if seed is not None:
            if not 0 <= seed < _MAX_SEED:
                raise ValueError(f"seed={seed}: DeepMind Control envs take seeds in [0, 2**32)")
            self._task_random.seed(seed)
        timestep = self.dm_env.reset()
        self._needs_reset = False
        return self._observe(timestep.observation, first=True), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        """Apply `action` (action_dim,) for `action_repeat` control steps; the reward is their sum."""
        if self._needs_reset:
            # dm_control would silently start a new episode instead.
            raise RuntimeError(
                f"{self.domain}/{self.task}: step() after the episode ended; call reset() first"
            )
        action = np.asarray(action, dtype=np.float64)
        if action.shape != self.action_space.shape:
            raise ValueError(
                f"action of shape {action.shape}; {self.domain}/{self.task} takes {self.action_space.shape}"
            )
        reward = 0.0
        for _ in range(self.action_repeat):
            timestep = self.dm_env.step(action)
            reward += timestep.reward or 0.0
            if timestep.last():
                break
        terminated = truncated = False
        if timestep.last():
            self._needs_reset = True
            # dm_control ends an episode with discount 0 on a terminal state, 1 on its time limit.
            terminated = timestep.discount == 0
            truncated = not terminated
        return self._observe(timestep.observation), float(reward), terminated, truncated, {}

    def render(self) -> np.ndarray | None:
        """The current frame (render_size, render_size, 3) uint8 in "rgb_array" mode, else None."""
        if self.render_mode != "rgb_array":
            return None
        return self._render(self.render_size)

    def close(self) -> None:
        """Free the physics and its rendering context."""
        physics = getattr(getattr(self, "dm_env", None), "physics", None)
        if physics is not None:
            physics.free()


if GYM_ID not in gym.registry:
    gym.register(id=GYM_ID, entry_point=DMCEnv, disable_env_checker=True)
