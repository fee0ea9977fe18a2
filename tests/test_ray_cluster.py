"""--runtime ray past one node: a real two-node Ray cluster on this machine, started as a user
starts one on two machines (`ray start --head`, then `ray start --address HEAD` with the
generators' resource), GRPO's generators placed on the second node, and that node killed
mid-run (its raylet and every process under it, as when a machine goes away)."""

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

pytest.importorskip("ray", reason="ray is not installed (the [ray] extra; in [dev])")
pytest.importorskip("transformers")

from test_ray_runtime import CLI_FLAGS, metrics, one_node_grpo_run, small, with_warm_up_of  # noqa: E402, F401

from omnigym.algos import grpo  # noqa: E402

pytestmark = pytest.mark.slow

BIN = Path(sys.executable).parent
RESOURCE = '{"omnigym_generator": 1}'


def free_ports(n: int) -> list[int]:
    sockets = [socket.socket() for _ in range(n)]
    for s in sockets:
        s.bind(("127.0.0.1", 0))
    ports = [s.getsockname()[1] for s in sockets]
    for s in sockets:
        s.close()
    return ports


def processes() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line) of every process on the machine."""
    table = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                parent = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            table[int(entry)] = (parent, cmd)
    return table


def with_descendants(roots: set[int], table: dict) -> set[int]:
    found, grew = set(roots), True
    while grew:
        more = {pid for pid, (parent, _) in table.items() if parent in found} - found
        found |= more
        grew = bool(more)
    return found


class TwoNodes:
    """A head (2 CPUs, where the trainer's process connects) and a worker node (2 CPUs and two
    ``omnigym_generator`` units), each with its own ports; only this test's processes are ever
    killed (found by this cluster's temp dir and node ports, never by name)."""

    def __init__(self):
        self.temp = tempfile.mkdtemp(prefix="ogray-", dir="/tmp")  # short: Ray's socket paths must fit 107 bytes
        gcs, client, *ports = free_ports(14)
        self.address = f"127.0.0.1:{gcs}"
        self.client, self.ports, self.head_port, self.worker_port = client, ports, ports[0], ports[6]
        # The head looks at each node every second, not 3 (Ray's default): a killed node is seen gone
        # after 5 refused looks, in about 5 s, not 15. A live node is still judged gone only after 5
        # looks in a row that each got no answer in 10 s, as before, however loaded the machine.
        self.env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"} | {"RAY_USAGE_STATS_ENABLED": "0",
                                                                                  "RAY_health_check_period_ms": "1000"}

    def start(self) -> None:
        gcs, client, ports = self.address.rsplit(":", 1)[1], self.client, self.ports
        self.ray("start", "--head", "--port", str(gcs), "--ray-client-server-port", str(client), "--num-cpus", "2",
                 "--include-dashboard", "false", "--temp-dir", f"{self.temp}/h", *self.node_ports(ports[:6]))
        self.ray("start", "--address", self.address, "--num-cpus", "2", "--resources", '{"omnigym_generator": 2}',
                 "--temp-dir", f"{self.temp}/w", *self.node_ports(ports[6:12]))

    @staticmethod
    def node_ports(p: list[int]) -> list[str]:
        """Two raylets on one machine: each its own ports (the defaults of a second one collide)."""
        return ["--node-ip-address", "127.0.0.1", "--node-manager-port", str(p[0]), "--object-manager-port", str(p[1]),
                "--dashboard-agent-listen-port", str(p[2]), "--dashboard-agent-grpc-port", str(p[3]),
                "--runtime-env-agent-port", str(p[4]), "--metrics-export-port", str(p[5]), "--disable-usage-stats",
                "--object-store-memory", str(200 * 2**20)]

    def ray(self, *args: str) -> None:
        done = subprocess.run([str(BIN / "ray"), *args], env=self.env, capture_output=True, text=True, timeout=180)
        assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]

    def raylet(self, port: int, table: dict) -> int:
        (pid,) = [pid for pid, (_, cmd) in table.items() if "raylet" in cmd.split(" ")[0]
                  and f"--node_manager_port={port}" in cmd]
        return pid

    def generators_on(self, port: int) -> int:
        """The generator actors running under the node whose raylet has ``port``."""
        table = processes()
        under = with_descendants({self.raylet(port, table)}, table)
        return sum(table[pid][1].startswith("ray::GeneratorWorker") for pid in under)

    def kill_worker_node(self) -> None:
        table = processes()
        for pid in with_descendants({self.raylet(self.worker_port, table)}, table):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def tear_down(self) -> None:
        table = processes()
        roots = {pid for pid, (_, cmd) in table.items() if self.temp in cmd}
        for port in (self.head_port, self.worker_port):
            roots |= {pid for pid, (_, cmd) in table.items() if f"--node_manager_port={port}" in cmd}
        for pid in with_descendants(roots, table) - {os.getpid()}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        shutil.rmtree(self.temp, ignore_errors=True)


def test_generators_on_a_second_node_give_the_one_node_runs_metrics_and_survive_its_loss(tmp_path, monkeypatch,
                                                                                          capsys, one_node_grpo_run):
    """Same seed and staleness: the run with its generators on the second node logs what the
    one-node run logs. Killed mid-run, the node's generators start again on the head, each lost
    job sampled with the weights it was sent with: the run goes on to the end with the same metrics.
    The one-node run is test_ray_runtime's (one_node_grpo_run); the two-node runs reuse its warm-up
    stage (trained in the trainer's process before any generator starts; test_stage_reuse.py shows
    a reused stage logs what a made one does)."""
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    one_node = metrics(one_node_grpo_run)
    assert len([r for r in one_node if "reward/mean" in r]) == 5

    cluster = TwoNodes()
    try:
        cluster.start()
        capsys.readouterr()
        two = with_warm_up_of(one_node_grpo_run, tmp_path / "two")
        grpo.train(small(two, ray_address=cluster.address, generator_resources=RESOURCE, overwrite=True))
        assert f"omnigym: joined the Ray cluster at {cluster.address} (2 nodes, 4 CPUs)" in capsys.readouterr().err
        assert metrics(tmp_path / "two") == one_node

        cut = with_warm_up_of(one_node_grpo_run, tmp_path / "cut")
        log = cut / "metrics.jsonl"
        err = open(tmp_path / "cut.err", "w")
        run = subprocess.Popen([str(BIN / "omnigym"), "train", "grpo", *CLI_FLAGS, "--run-dir", str(cut), "--overwrite",
                                "--ray-address", cluster.address, "--generator-resources", RESOURCE],
                               env={**cluster.env, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"},
                               stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.monotonic() + 600
        while not (log.exists() and len(log.read_text().splitlines()) >= 2):  # two GRPO steps done, three to go
            assert run.poll() is None and time.monotonic() < deadline, "the run ended before its node could be killed"
            time.sleep(0.05)
        assert (cluster.generators_on(cluster.worker_port), cluster.generators_on(cluster.head_port)) == (2, 0)
        cluster.kill_worker_node()
        assert run.wait(timeout=900) == 0, (tmp_path / "cut.err").read_text()[-3000:]
        said = (tmp_path / "cut.err").read_text()
        assert said.count("node left the Ray cluster and no node left has --generator-resources "
                          '{"omnigym_generator": 1}; it goes on on the nodes left') == 2, said[-3000:]
        assert metrics(cut) == one_node  # nothing lost, nothing sampled from other weights
    finally:
        cluster.tear_down()
