"""Headless MuJoCo rendering on a machine without a display: which OpenGL backend, and what must load first.

Torch-free (async env workers import it).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import os
import sys


def default_gl_backend() -> str | None:
    """A headless OpenGL backend whose library is installed (`egl`, then `osmesa`), or None."""
    if ctypes.util.find_library("EGL"):
        return "egl"
    if ctypes.util.find_library("OSMesa"):
        return "osmesa"
    return None


def choose_gl_backend() -> None:
    """Set `MUJOCO_GL` to a headless backend when the user set none. Call before mujoco or dm_control is first
    imported: they read it then."""
    if "MUJOCO_GL" not in os.environ and (backend := default_gl_backend()) is not None:
        os.environ["MUJOCO_GL"] = backend


def load_before_gl() -> None:
    """Load what must not load after the first headless GL context of a process that has torch.

    A headless context loads Mesa's LLVM; triton (which torch.compile, torch.optim's first use and diffusers
    import) loaded after it crashes the process, loaded before it does not. A process with torch may load
    triton later, so it is loaded now; a torch-free worker needs nothing.
    """
    if "torch" in sys.modules and os.environ.get("MUJOCO_GL") in ("egl", "osmesa"):
        with contextlib.suppress(ImportError):
            import triton  # noqa: F401
