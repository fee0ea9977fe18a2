"""Which Ray a run uses: a cluster it joins (``--ray-address``, else Ray's own ``RAY_ADDRESS``)
or a local one started for the run; and where the generators go (``--generator-resources``).

Joining is Ray's own convention: ``ray start --head`` on one machine, ``ray start --address
HEAD:PORT`` on the others, and the driver connects with the head's address (or ``auto`` on a
machine of the cluster). Placement is Ray's too: a node started with ``--resources
'{"omnigym_generator": 2}'`` holds two generators that ask for ``{"omnigym_generator": 1}``.
An address that does not answer is one line before the run starts (ray.init itself retries for
a minute and then raises a page of traceback).
"""

from __future__ import annotations

import json
import math
import os
import socket
import sys

from omnigym.errors import OmnigymError, require

PROBE_TIMEOUT = 5.0
"""seconds the check waits for a cluster's head to accept a connection"""


def cluster_address(flag: str | None) -> tuple[str | None, str]:
    """(the address to join, how it was given) -- ``--ray-address``, else ``RAY_ADDRESS``; ``None``:
    start a local Ray for the run (``local`` says so too, as it does to Ray)."""
    if flag:
        address, source = flag, f"--ray-address {flag}"
    else:
        address = os.environ.get("RAY_ADDRESS") or None
        source = f"RAY_ADDRESS={address}"
    return (None if address in (None, "local") else address), source


def check_cluster(flag: str | None) -> None:
    """The cluster a run would join answers at its address, or one line says what to do."""
    address, source = cluster_address(flag)
    if address is None or address.startswith("ray://"):  # Ray Client: ray.init says what is wrong
        return
    host_port = _local_cluster() if address == "auto" else address
    if host_port is None:
        raise OmnigymError(f"{source}: no Ray cluster was started on this machine; start one with "
                           "`ray start --head`, or give its head's host:port")
    host, _, port = host_port.rpartition(":")
    if not host or not port.isdigit():
        raise OmnigymError(f"{source}: not a Ray cluster address (HOST:PORT expected); give the head's host:port, "
                           "as `ray start --head` printed it")
    try:
        socket.create_connection((host, int(port)), timeout=PROBE_TIMEOUT).close()
    except (OSError, ValueError) as error:
        why = getattr(error, "strerror", None) or str(error) or type(error).__name__
        raise OmnigymError(f"{source}: no Ray cluster answers there ({why}); start it with "
                           "`ray start --head`, or give the address it printed") from None


def _local_cluster() -> str | None:
    """``auto``: the head of the cluster started on this machine, as Ray finds it (Ray has no public
    call for this, so its private one is guarded: should it move, `auto` reads as no cluster here)."""
    try:
        from ray._private import services

        return services.canonicalize_bootstrap_address("auto")
    except (ImportError, AttributeError, ConnectionError, ValueError):
        return None


def generator_resources(text: str) -> dict:
    """``--generator-resources`` as the dict Ray's ``resources=`` takes ({} when not given)."""
    if not text:
        return {}
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        value = None
    require(isinstance(value, dict) and value and all(
        isinstance(k, str) and type(v) in (int, float) and math.isfinite(v) and v > 0 for k, v in value.items()),
        f"--generator-resources must be a JSON object of Ray resource names and positive amounts, as "
        f"`ray start --resources` takes, e.g. '{{\"omnigym_generator\": 1}}'; got {text!r}")
    require(not {"CPU", "GPU", "memory"} & set(value),
            "--generator-resources names custom resources; CPU, GPU and memory are Ray's own (each generator "
            "takes one CPU)")
    return value


def init_ray(flag: str | None, num_cpus: int, env_vars: dict) -> None:
    """Join the cluster (one line says which), or start a local Ray with ``num_cpus`` CPUs."""
    import ray

    address, source = cluster_address(flag)
    common = dict(logging_level="ERROR", log_to_driver=True, runtime_env={"env_vars": env_vars})
    if address is None:
        ray.init(address="local", num_cpus=num_cpus, include_dashboard=False, **common)
        return
    try:  # a cluster's size is its nodes' to say: num_cpus is not given when joining
        context = ray.init(address=address, **common)
    except (ConnectionError, ValueError, RuntimeError) as error:
        raise OmnigymError(f"{source}: could not join the Ray cluster ({str(error).strip().splitlines()[-1]}); "
                           "check `ray status` on its head") from None
    nodes = [node for node in ray.nodes() if node.get("Alive")]
    cpus = ray.cluster_resources().get("CPU", 0)
    named = address if address != "auto" else getattr(context, "address_info", {}).get("gcs_address", address)
    print(f"omnigym: joined the Ray cluster at {named} ({len(nodes)} node{'s' * (len(nodes) != 1)}, {cpus:g} CPUs)",
          file=sys.stderr, flush=True)


def has_node_with(resources: dict) -> bool:
    """Whether a live node of the cluster holds ``resources`` (free or not)."""
    import ray

    return any(node.get("Alive") and all(node.get("Resources", {}).get(name, 0) >= amount
                                         for name, amount in resources.items()) for node in ray.nodes())
