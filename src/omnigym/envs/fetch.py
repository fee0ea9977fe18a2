"""gymnasium-robotics' Fetch tasks with the joint helpers fixed on each env, not in the library.

gymnasium-robotics 1.4.2's ``utils.mujoco_utils`` checks a joint's type with ``in`` against
MuJoCo's enums, which mujoco >= 3.17 answers False, so every Fetch env fails its constructor
(``envs/goal.py: joint_enum_bug``). A Fetch env reaches those helpers through its own
``self._utils`` (set by ``MujocoRobotEnv.__init__`` to the module); the subclasses here point
that attribute of *their* instance at ``JointsByName``, which answers the four joint helpers
(and ``robot_get_obs``, which calls them inside the module) with MuJoCo's named access and passes everything else to the module. The library's module, and
any other env or user code calling it, is left as it is. ``envs/goal.py`` registers these
classes under the Fetch ids only where the bug is, and this module is imported only then.
"""

from __future__ import annotations

import gymnasium_robotics
import numpy as np
from gymnasium_robotics.envs.fetch.pick_and_place import MujocoFetchPickAndPlaceEnv
from gymnasium_robotics.envs.fetch.push import MujocoFetchPushEnv
from gymnasium_robotics.envs.fetch.reach import MujocoFetchReachEnv
from gymnasium_robotics.envs.fetch.slide import MujocoFetchSlideEnv

from omnigym.errors import OmnigymError

if not hasattr(MujocoFetchReachEnv, "_initialize_simulation"):  # the hook the subclasses use
    raise OmnigymError(f"gymnasium-robotics {gymnasium_robotics.__version__} no longer has "
                       "MujocoRobotEnv._initialize_simulation, which omnigym's Fetch fix overrides; "
                       "pip install 'gymnasium-robotics==1.4.2' or report it")


class JointsByName:
    """``mujoco_utils`` as a Fetch env calls it, with the joint helpers that index by joint
    type replaced by ``data.joint(name)``, which knows each joint type's width."""

    def __init__(self, utils):
        self.utils = utils

    def __getattr__(self, name):
        return getattr(self.utils, name)

    def robot_get_obs(self, model, data, joint_names):
        """The robot's joint positions and velocities: the library's own function, whose body
        calls the module's joint helpers directly, written again over the fixed ones."""
        if data.qpos is not None and joint_names:
            names = [n for n in joint_names if n.startswith("robot")]
            return (np.squeeze(np.array([self.get_joint_qpos(model, data, n) for n in names])),
                    np.squeeze(np.array([self.get_joint_qvel(model, data, n) for n in names])))
        return np.zeros(0), np.zeros(0)

    @staticmethod
    def set_joint_qpos(model, data, name, value):
        data.joint(name).qpos[:] = value

    @staticmethod
    def set_joint_qvel(model, data, name, value):
        data.joint(name).qvel[:] = value

    @staticmethod
    def get_joint_qpos(model, data, name):
        return data.joint(name).qpos.copy()

    @staticmethod
    def get_joint_qvel(model, data, name):
        return data.joint(name).qvel.copy()


class JointFix:
    """Mixed in before a Fetch env class: its helpers are ``JointsByName`` from the first
    simulation step (``_initialize_simulation`` runs inside the constructor)."""

    def _initialize_simulation(self):
        if not isinstance(self._utils, JointsByName):
            self._utils = JointsByName(self._utils)
        super()._initialize_simulation()


class FetchReach(JointFix, MujocoFetchReachEnv):
    pass


class FetchPush(JointFix, MujocoFetchPushEnv):
    pass


class FetchPickAndPlace(JointFix, MujocoFetchPickAndPlaceEnv):
    pass


class FetchSlide(JointFix, MujocoFetchSlideEnv):
    pass


FIXED = (("FetchReach-v4", "omnigym.envs.fetch:FetchReach"), ("FetchPush-v4", "omnigym.envs.fetch:FetchPush"),
         ("FetchPickAndPlace-v4", "omnigym.envs.fetch:FetchPickAndPlace"),
         ("FetchSlide-v4", "omnigym.envs.fetch:FetchSlide"))
"""each Fetch id omnigym supports, and the fixed class it is made from where the bug is"""
