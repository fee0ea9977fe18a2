"""Random-shift image augmentation, as DrQ-v2 (Yarats et al., 2021) applies it.

Each image of a batch is padded by ``pad`` pixels on every side, repeating its border
pixels, and a window of the original size is cut out at an offset drawn per image, up to
``pad`` pixels in each direction. The cut is a bilinear ``grid_sample`` whose sample
points fall on pixel centres, so an integer shift moves the image by whole pixels and a
shift of zero returns it unchanged. DrQ (Kostrikov et al., 2020) and DrQ-v2 use pad 4 on
84 x 84 frames.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def shift_images(images: torch.Tensor, shifts: torch.Tensor, pad: int = 4) -> torch.Tensor:
    """``images`` ``[n, c, h, h]`` (any dtype) moved by ``shifts`` ``[n, 2]`` whole pixels
    (x, y), each in ``[-pad, pad]``; the uncovered border repeats the edge. Returns float32."""
    n, _, height, width = images.shape
    if height != width:
        raise ValueError(f"random shifts take square images, got {height} x {width}")
    padded = F.pad(images.float(), (pad, pad, pad, pad), mode="replicate")
    size = height + 2 * pad
    # grid_sample's coordinates run from -1 to 1 across the padded image (align_corners=False:
    # the outer edges of the outer pixels); pixel i's centre is at -1 + (2i + 1) / size.
    centres = -1.0 + (2.0 * torch.arange(pad, pad + height, device=images.device) + 1.0) / size
    ys, xs = torch.meshgrid(centres, centres, indexing="ij")
    grid = torch.stack((xs, ys), -1).unsqueeze(0)  # [1, h, w, (x, y)]
    offset = shifts.to(device=images.device, dtype=torch.float32).view(n, 1, 1, 2) * (2.0 / size)
    return F.grid_sample(padded, grid + offset, mode="bilinear", padding_mode="zeros", align_corners=False)


def random_shift(images: torch.Tensor, pad: int = 4, generator: torch.Generator | None = None) -> torch.Tensor:
    """``images`` each shifted by its own offset, uniform over whole pixels in ``[-pad, pad]^2``."""
    shifts = torch.randint(-pad, pad + 1, (len(images), 2), generator=generator)
    return shift_images(images, shifts, pad)
