"""Headless MuJoCo rendering on a machine without a display: which OpenGL backend, what must load first, and
one line instead of a traceback when the backend cannot render.

mujoco and dm_control read `MUJOCO_GL` once, when first imported, and fail to import on a value that cannot
work (an unknown name, a backend whose library is missing), even in a run that renders nothing. So the envs
import them inside `gl_for_import`, which imports them with rendering off in that case; only a render then
fails, with the one line of `check_gl` (the envs call it before they render). A value that imports but cannot
make a context (glfw without a display, a broken driver) fails at the first render: `gl_failure` says it in
one line. Either line names the backend that works here.

Torch-free (async env workers import it).
"""

from __future__ import annotations

import contextlib
import ctypes.util
import functools
import os
import subprocess
import sys
from collections.abc import Iterator

from lerobot.errors import RenderingError

GL_ENV = "MUJOCO_GL"
# The values both mujoco and dm_control read as "no rendering", and the one used for an import.
_OFF = ("disable", "disabled", "off", "false", "0")
# The values that mean GLFW (a window system) to both of them.
_GLFW = ("glfw", "enable", "enabled", "on", "true", "1", "")
# Headless backends and the library each loads.
_HEADLESS = {"egl": "EGL", "osmesa": "OSMesa"}
# What `gl_for_import` found wrong with the user's value, in words (None: nothing): set once per process, when
# mujoco or dm_control were imported with rendering off instead.
_imported_without_gl: str | None = None


def default_gl_backend() -> str | None:
    """A headless OpenGL backend whose library is installed (`egl`, then `osmesa`), or None."""
    return next((name for name, lib in _HEADLESS.items() if ctypes.util.find_library(lib)), None)


@functools.cache
def gl_problem(value: str) -> str | None:
    """Why `MUJOCO_GL=value` cannot render on this machine, found without loading any OpenGL library (an
    unknown name, a missing library, GLFW without a display, rendering turned off); None when it may."""
    name = value.strip().lower()
    if name in _OFF:
        return "turns rendering off"
    if name in _HEADLESS:
        lib = _HEADLESS[name]
        return None if ctypes.util.find_library(lib) else f"needs lib{lib}, which is not installed"
    if name in _GLFW or name == "glx":
        if sys.platform.startswith("linux") and not (
            os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY")
        ):
            return "needs a display (DISPLAY is not set)"
        return None
    return f"is not an OpenGL backend of MuJoCo ({', '.join(_HEADLESS)} or glfw)"


@contextlib.contextmanager
def gl_for_import() -> Iterator[None]:
    """Around the first import of mujoco or dm_control, which read `MUJOCO_GL` then: a headless backend when
    the user set none (kept), and rendering off for the import when the user's value cannot render here
    (`gl_problem`; the user's value is back afterwards), so that a run that renders nothing runs anyway and
    one that renders fails in one line (`check_gl`)."""
    global _imported_without_gl
    if GL_ENV not in os.environ and (backend := default_gl_backend()) is not None:
        os.environ[GL_ENV] = backend
    value = os.environ.get(GL_ENV)
    problem = None if value is None else gl_problem(value)
    if problem is None:
        yield
        return
    _imported_without_gl = f"{GL_ENV}={value} {problem}"
    os.environ[GL_ENV] = _OFF[0]
    try:
        yield
    finally:
        os.environ[GL_ENV] = value


def check_gl() -> None:
    """Raise `RenderingError` (one line: the backend, why it cannot render, the one to use) when MuJoCo was
    imported without a usable OpenGL backend (`gl_for_import`). Call before rendering."""
    if _imported_without_gl is not None:
        raise RenderingError(f"{_imported_without_gl}: {_advice(os.environ.get(GL_ENV, ''))}")


def gl_failure(error: BaseException) -> RenderingError:
    """The one-line error for a first render that failed with `error` under this process's `MUJOCO_GL`."""
    value = os.environ.get(GL_ENV, "")
    detail = (str(error).strip().splitlines() or [""])[0]
    return RenderingError(
        f"{GL_ENV}={value} cannot render here ({type(error).__name__}: {detail}): {_advice(value)}"
    )


def _advice(failed: str) -> str:
    """What to set instead of `MUJOCO_GL=failed`: a headless backend that renders here, or what to install."""
    working = working_gl_backend(exclude=failed.strip().lower())
    if working is not None:
        return f"set {GL_ENV}={working} (it renders here)"
    return (
        f"install EGL or OSMesa (e.g. apt-get install libegl1 or libosmesa6) and set {GL_ENV}=egl or "
        f"{GL_ENV}=osmesa"
    )


@functools.cache
def working_gl_backend(exclude: str = "") -> str | None:
    """A headless backend other than `exclude` that makes an OpenGL context on this machine (tried in a child
    process, which a failed library cannot crash), or None."""
    probe = "import mujoco; context = mujoco.GLContext(8, 8); context.make_current(); context.free()"
    for name, lib in _HEADLESS.items():
        if name == exclude or not ctypes.util.find_library(lib):
            continue
        with contextlib.suppress(OSError, subprocess.TimeoutExpired):
            done = subprocess.run(
                [sys.executable, "-c", probe],
                env={**os.environ, GL_ENV: name},
                capture_output=True,
                timeout=120,
            )
            if done.returncode == 0:
                return name
    return None


def load_before_gl() -> None:
    """Load what must not load after the first headless GL context of a process that has torch.

    A headless context loads Mesa's LLVM; triton (which torch.compile, torch.optim's first use and diffusers
    import) loaded after it crashes the process, loaded before it does not. A process with torch may load
    triton later, so it is loaded now; a torch-free worker needs nothing.
    """
    if "torch" in sys.modules and os.environ.get(GL_ENV) in _HEADLESS:
        with contextlib.suppress(ImportError):
            import triton  # noqa: F401
