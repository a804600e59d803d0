"""PushT's keypoint and reward rules, computed from a block pose without running the simulator.

These functions reproduce what gym-pusht (`gym_pusht/envs/pusht.py`) computes, so that features derived from
recorded demonstrations match what a policy sees in the env:

- `environment_state`: the 8 corners of the T's two rectangles (16 numbers), in the order pymunk stores each
  polygon's vertices, placed at the block pose.
- reward: the fraction of the goal T covered by the block, divided by the success threshold and clipped to
  [0, 1]; success: coverage strictly above 0.95.

A block pose is `(x, y, angle)` where `(x, y)` is what pymunk's `Body.position` returns, i.e. the body's
origin in world coordinates (not its centre of gravity), and `angle` is `Body.angle` in radians. A point `v`
given in the body's frame lands at `(x, y) + R(angle) @ v`. Both gym-pusht's `state` observation and the
Diffusion Policy zarr store the pose in this convention.

Only numpy, shapely and pymunk are used (no gym import), so datasets and envs can share one definition.
"""

from __future__ import annotations

import numpy as np
import pymunk
import shapely

# gym-pusht's T: a horizontal bar of 4x1 units on top of a vertical 1x3 stem, with 30 pixels per unit.
_SCALE = 30.0
_LENGTH = 4.0
_BAR = [
    (-_LENGTH * _SCALE / 2, _SCALE),
    (_LENGTH * _SCALE / 2, _SCALE),
    (_LENGTH * _SCALE / 2, 0.0),
    (-_LENGTH * _SCALE / 2, 0.0),
]
_STEM = [
    (-_SCALE / 2, _SCALE),
    (-_SCALE / 2, _LENGTH * _SCALE),
    (_SCALE / 2, _LENGTH * _SCALE),
    (_SCALE / 2, _SCALE),
]

# The square workspace, in pixels: gym-pusht's action space and its positions span [0, WORKSPACE_SIZE].
WORKSPACE_SIZE = 512.0
# Bounds of gym-pusht's state observation (agent x, y, block x, y, block angle wrapped to [0, 2 pi]), the
# layout of the recorded `data/state`; actions are target agent positions within the workspace.
STATE_LOW = np.zeros(5)
STATE_HIGH = np.array([WORKSPACE_SIZE] * 4 + [2 * np.pi])
ACTION_LOW = np.zeros(2)
ACTION_HIGH = np.full(2, WORKSPACE_SIZE)

# Goal pose of the block (x, y, angle), fixed in gym-pusht.
GOAL_POSE = np.array([256.0, 256.0, np.pi / 4])
# Coverage above which an episode counts as a success (and terminates in the env).
SUCCESS_THRESHOLD = 0.95


def _local_vertices() -> np.ndarray:
    """The T's polygon vertices in the body frame, (2, 4, 2), in the order pymunk keeps them.

    pymunk computes the convex hull of the vertices it is given and may reorder them; gym-pusht's keypoints
    follow pymunk's order, so ask pymunk instead of trusting the order written above.
    """
    body = pymunk.Body(1.0, 1.0)
    polys = [pymunk.Poly(body, verts) for verts in (_BAR, _STEM)]
    return np.array([[(v.x, v.y) for v in poly.get_vertices()] for poly in polys], dtype=np.float64)


LOCAL_VERTICES = _local_vertices()


def _as_poses(block_pose: np.ndarray) -> np.ndarray:
    poses = np.asarray(block_pose, dtype=np.float64)
    if poses.ndim != 2 or poses.shape[1] != 3:
        raise ValueError(f"block_pose must have shape (N, 3) = x, y, angle; got {poses.shape}")
    return poses


def _world_vertices(poses: np.ndarray) -> np.ndarray:
    """Vertices of both rectangles placed at each pose: (N, 3) -> (N, 2, 4, 2) in float64."""
    cos, sin = np.cos(poses[:, 2]), np.sin(poses[:, 2])
    # Rotation matrices (N, 2, 2) applied to every vertex, then translated by the body origin.
    rot = np.stack([np.stack([cos, -sin], -1), np.stack([sin, cos], -1)], -2)
    verts = np.einsum("nij,pkj->npki", rot, LOCAL_VERTICES)
    return verts + poses[:, None, None, :2]


def block_keypoints(block_pose: np.ndarray) -> np.ndarray:
    """gym-pusht's `environment_state` for each block pose.

    Args:
        block_pose: (N, 3) float, block x, y (body origin, pixels) and angle (radians).

    Returns:
        (N, 16) float64: keypoints `[x0, y0, x1, y1, ..., x7, y7]`, bar corners first, then stem corners.
    """
    poses = _as_poses(block_pose)
    return _world_vertices(poses).reshape(len(poses), 16)


def _polygons(verts: np.ndarray) -> np.ndarray:
    """(N, 4, 2) quadrilateral vertices -> (N,) shapely polygons (closed by shapely)."""
    return shapely.polygons(verts)


_GOAL_PARTS = [_polygons(v[None])[0] for v in _world_vertices(GOAL_POSE[None])[0]]
_GOAL_AREA = float(sum(p.area for p in _GOAL_PARTS))


def block_coverage(block_pose: np.ndarray) -> np.ndarray:
    """Fraction of the goal T's area covered by the block at each pose.

    The env intersects two MultiPolygons (block and goal, each the union of two rectangles that only share an
    edge); since the rectangles never overlap, that area equals the sum of the 4 pairwise rectangle
    intersections, which shapely computes vectorized over all poses.

    Args:
        block_pose: (N, 3) float, block x, y, angle.

    Returns:
        (N,) float64 in [0, 1].
    """
    poses = _as_poses(block_pose)
    verts = _world_vertices(poses)
    area = np.zeros(len(poses))
    for part in range(2):
        block_part = _polygons(verts[:, part])
        for goal_part in _GOAL_PARTS:
            area += shapely.area(shapely.intersection(block_part, goal_part))
    return area / _GOAL_AREA


def coverage_reward(block_pose: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """gym-pusht's reward and success for the block at each pose (the state reached after an action).

    Args:
        block_pose: (N, 3) float, block x, y, angle.

    Returns:
        reward: (N,) float64, `clip(coverage / 0.95, 0, 1)`.
        success: (N,) bool, `coverage > 0.95`.
    """
    coverage = block_coverage(block_pose)
    reward = np.clip(coverage / SUCCESS_THRESHOLD, 0.0, 1.0)
    return reward, coverage > SUCCESS_THRESHOLD
