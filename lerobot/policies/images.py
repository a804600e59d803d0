"""Image operations the policies' vision trunks share."""

from __future__ import annotations

from torch import Tensor, nn


def resize(images: Tensor, size: tuple[int, int] | None) -> Tensor:
    """`images` (N, C, H, W) resized to `(N, C, *size)` (bilinear, antialiased); as they are when `size` is
    None or already their size."""
    if size is None or tuple(images.shape[-2:]) == size:
        return images
    return nn.functional.interpolate(images, size=size, mode="bilinear", antialias=True, align_corners=False)
