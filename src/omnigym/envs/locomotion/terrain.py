"""Rough terrain: one heightfield of random bumps, and the height scan the policy sees.

Isaac Lab's rough velocity task mixes sub-terrains (stairs, slopes, random rough); here one
``random uniform`` field, Isaac Lab's ``HfRandomUniformTerrainCfg`` idea: heights drawn on a
0.1 m grid from ``noise_range`` in ``noise_step`` increments. The field is static, so the height
scan is a bilinear lookup in numpy (no ray casts): Isaac Lab's ``GridPatternCfg`` of 1.6 m x
1.0 m at 0.1 m (17 x 11 = 187 points) around the base, yaw-aligned, reported as base height
minus ground height minus 0.5 m (its ``height_scan`` observation's offset).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SCAN_X = np.linspace(-0.8, 0.8, 17)
SCAN_Y = np.linspace(-0.5, 0.5, 11)
SCAN_OFFSET = 0.5


@dataclass
class Heightfield:
    size: float = 24.0
    """side of the square field in metres; the robot starts at its centre"""
    resolution: float = 0.1
    noise_range: tuple[float, float] = (0.0, 0.06)
    noise_step: float = 0.02
    seed: int = 0
    """the field's layout (fixed per task: every env walks the same ground)"""

    def __post_init__(self):
        rng = np.random.default_rng(self.seed)
        n = int(round(self.size / self.resolution)) + 1
        steps = np.arange(self.noise_range[0], self.noise_range[1] + 1e-9, self.noise_step)
        heights = rng.choice(steps, size=(n, n))
        middle = slice(n // 2 - 5, n // 2 + 6)
        heights[middle, middle] = steps[0]  # a flat patch to spawn on
        self.heights = heights  # [row = y, column = x], metres
        self.top = float(max(heights.max(), 1e-3))

    def add_to(self, spec) -> None:
        """The field as MuJoCo's ``hfield`` asset and a geom named ``floor`` at the origin."""
        import mujoco

        from omnigym.envs.locomotion.robots import FLOOR

        n = self.heights.shape[0]
        half = self.size / 2
        spec.add_hfield(name="terrain", size=[half, half, self.top, 0.1], nrow=n, ncol=n,
                        userdata=list((self.heights / self.top).astype(np.float32).ravel()))
        spec.worldbody.add_geom(name=FLOOR, type=mujoco.mjtGeom.mjGEOM_HFIELD, hfieldname="terrain",
                                rgba=[0.45, 0.5, 0.55, 1])

    def height_at(self, xy: np.ndarray) -> np.ndarray:
        """Ground heights at world points ``xy`` (..., 2), bilinear between grid points."""
        n = self.heights.shape[0]
        grid = (xy + self.size / 2) / self.resolution
        grid = np.clip(grid, 0, n - 1.000001)
        i0 = np.floor(grid).astype(int)
        frac = grid - i0
        x0, y0 = i0[..., 0], i0[..., 1]
        h = self.heights
        top = h[y0, x0] * (1 - frac[..., 0]) + h[y0, x0 + 1] * frac[..., 0]
        bottom = h[y0 + 1, x0] * (1 - frac[..., 0]) + h[y0 + 1, x0 + 1] * frac[..., 0]
        return top * (1 - frac[..., 1]) + bottom * frac[..., 1]

    def inside(self, xy: np.ndarray, margin: float = 1.0) -> np.ndarray:
        return np.all(np.abs(xy) < self.size / 2 - margin, axis=-1)

    def scan(self, base_pos: np.ndarray, yaw: np.ndarray) -> np.ndarray:
        """(N, 187): base height above the ground under each scan point, minus 0.5 m."""
        gx, gy = np.meshgrid(SCAN_X, SCAN_Y, indexing="ij")
        local = np.stack([gx.ravel(), gy.ravel()], -1)  # (187, 2)
        c, s = np.cos(yaw)[:, None], np.sin(yaw)[:, None]
        world = np.stack([base_pos[:, None, 0] + c * local[:, 0] - s * local[:, 1],
                          base_pos[:, None, 1] + s * local[:, 0] + c * local[:, 1]], -1)
        return base_pos[:, 2:3] - self.height_at(world) - SCAN_OFFSET
