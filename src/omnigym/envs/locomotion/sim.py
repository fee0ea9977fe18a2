"""Stepping N MuJoCo worlds one policy step (``decimation`` physics steps) at a time.

Two steppers with one contract (``qpos``/``qvel`` arrays, ``set_state``, ``step(controls)``
returning each substep's sensordata), so the task code does not know which runs:

- ``RolloutStepper``: MuJoCo's ``mujoco.rollout`` (C++, a persistent thread pool, the GIL
  released): all N envs' ``decimation`` substeps in one call, one MjModel per env (so friction,
  mass and motor strength can differ per env).
- ``LoopStepper``: a Python loop of ``mj_step`` over N MjData, the plain way.

bench/locomotion_throughput.py measures both against raw ``mj_step``; rollout is the default.
"""

from __future__ import annotations

from types import MappingProxyType

import numpy as np


class RolloutStepper:
    def __init__(self, models: list, nthread: int = 2):
        import mujoco
        import mujoco.rollout

        self.models = models
        model = models[0]
        self.nq, self.nv = model.nq, model.nv
        self.spec = int(mujoco.mjtState.mjSTATE_FULLPHYSICS)
        self.nstate = mujoco.mj_stateSize(model, self.spec)
        # mj_getState's layout: time, qpos, qvel, then act, history, ... (mjtState's bit order)
        self.qpos_at = mujoco.mj_stateSize(model, int(mujoco.mjtState.mjSTATE_TIME))
        self.qvel_at = self.qpos_at + self.nq
        self.state = np.zeros((len(models), self.nstate))
        self.pool = mujoco.rollout.Rollout(nthread=nthread)
        self.datas = [mujoco.MjData(model) for _ in range(max(nthread, 1))]
        self._out = None

    @property
    def qpos(self) -> np.ndarray:
        return self.state[:, self.qpos_at:self.qvel_at]

    @property
    def qvel(self) -> np.ndarray:
        return self.state[:, self.qvel_at:self.qvel_at + self.nv]

    def set_state(self, ids, qpos: np.ndarray, qvel: np.ndarray) -> None:
        self.state[ids] = 0.0
        self.state[ids, self.qpos_at:self.qvel_at] = qpos
        self.state[ids, self.qvel_at:self.qvel_at + self.nv] = qvel

    def step(self, controls: np.ndarray) -> np.ndarray:
        """``controls`` (N, substeps, nu) -> sensordata (N, substeps, nsensordata)."""
        n, substeps = controls.shape[:2]
        if self._out is None or self._out[0].shape[1] != substeps:
            self._out = (np.empty((n, substeps, self.nstate)),
                         np.empty((n, substeps, self.models[0].nsensordata)))
        state, sensordata = self._out
        self.pool.rollout(self.models, self.datas, self.state, controls, nstep=substeps, state=state,
                          sensordata=sensordata, skip_checks=True)
        self.state[:] = state[:, -1]
        return sensordata

    def close(self) -> None:
        self.pool.close()


class LoopStepper:
    def __init__(self, models: list, nthread: int = 0):
        import mujoco

        self.models = models
        self.datas = [mujoco.MjData(m) for m in models]
        self._step = mujoco.mj_step

    @property
    def qpos(self) -> np.ndarray:
        return np.stack([d.qpos for d in self.datas])

    @property
    def qvel(self) -> np.ndarray:
        return np.stack([d.qvel for d in self.datas])

    def set_state(self, ids, qpos: np.ndarray, qvel: np.ndarray) -> None:
        import mujoco

        ids = np.arange(len(self.datas))[ids]
        qpos, qvel = np.broadcast_to(qpos, (len(ids), qpos.shape[-1])), np.broadcast_to(qvel, (len(ids), qvel.shape[-1]))
        for k, i in enumerate(ids):
            mujoco.mj_resetData(self.models[i], self.datas[i])
            self.datas[i].qpos[:] = qpos[k]
            self.datas[i].qvel[:] = qvel[k]

    def step(self, controls: np.ndarray) -> np.ndarray:
        n, substeps = controls.shape[:2]
        out = np.empty((n, substeps, self.models[0].nsensordata))
        for i, (model, data) in enumerate(zip(self.models, self.datas)):
            for k in range(substeps):
                data.ctrl[:] = controls[i, k]
                self._step(model, data)
                out[i, k] = data.sensordata
        return out

    def close(self) -> None:
        pass


STEPPERS = MappingProxyType({"rollout": RolloutStepper, "loop": LoopStepper})
