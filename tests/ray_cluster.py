"""A real two-node Ray cluster on this machine, for tests: `ray start --head` plus a second node
joining it, both on loopback with their own ports and temp dir, stopped by PID at the end
(never `ray stop`, which would stop every Ray of the user, including the session's own)."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from conftest import free_port


HEAD_IP, WORKER_IP = "127.0.0.2", "127.0.0.3"


@dataclass
class Cluster:
    gcs_address: str
    dashboard_url: str
    temp_dir: str
    env: dict[str, str]
    pids: list[int] = field(default_factory=list)


def _agent_ports() -> list[str]:
    """Every per-node port a second node on the same machine would otherwise take from the first."""
    return ["--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
            "--metrics-export-port", str(free_port()), "--runtime-env-agent-port", str(free_port()),
            "--node-manager-port", str(free_port()), "--object-manager-port", str(free_port())]


def _ray(args: list[str], env: dict[str, str]) -> None:
    ray = str(Path(sys.executable).with_name("ray"))
    proc = subprocess.run([ray, "start", *args], env=env, capture_output=True, text=True, timeout=180)
    if proc.returncode != 0:
        raise RuntimeError(f"ray start {' '.join(args[:2])} failed:\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")


def _procs() -> dict[int, tuple[int, str]]:
    """pid -> (parent pid, command line), from /proc."""
    out = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as fh:
                ppid = int(fh.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{entry}/cmdline", "rb") as fh:
                cmd = fh.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        out[int(entry)] = (ppid, cmd)
    return out


def processes_under(temp_dir: str) -> list[int]:
    """PIDs of the processes started for this cluster: those whose command line names its temp
    dir, and their descendants (workers rename themselves `ray::...`)."""
    procs = _procs()
    pids = {pid for pid, (_, cmd) in procs.items() if temp_dir in cmd}
    grew = True
    while grew:
        more = {pid for pid, (ppid, _) in procs.items() if ppid in pids} - pids
        pids |= more
        grew = bool(more)
    return sorted(pids - {os.getpid()})


def start_cluster(cpus_per_node: int = 2) -> Cluster:
    temp_dir = tempfile.mkdtemp(prefix="rc-", dir="/tmp")  # short: Ray puts unix sockets under it
    # (RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0, which pins a local ray.init to 127.0.0.1, forbids a second node)
    env = {**os.environ, "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "1", "RAY_USAGE_STATS_ENABLED": "0",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("RAY_ADDRESS", None)
    # Token auth, as a production cluster runs it: every node and client of this cluster gets the
    # token from the environment (nothing written to ~/.ray).
    env.update({"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)})
    port, dash = free_port(), free_port()
    common = ["--num-cpus", str(cpus_per_node), "--disable-usage-stats"]
    # Node IPs on loopback, one per node. Not 127.0.0.1: a multi-node `ray start` replaces that by
    # the machine's outward address (services.resolve_ip_for_localhost); 127.0.0.2/3 stay as given.
    _ray(["--head", "--node-ip-address", HEAD_IP, "--port", str(port), "--dashboard-host", "127.0.0.1",
          "--dashboard-port", str(dash), "--include-dashboard", "true", "--ray-client-server-port", str(free_port()),
          "--temp-dir", temp_dir, *common, *_agent_ports()], env)
    cluster = Cluster(f"{HEAD_IP}:{port}", f"http://127.0.0.1:{dash}", temp_dir, env)
    # Ray's clients take RAY_API_SERVER_ADDRESS over the address they are given; a local ray.init
    # of this test session has set it to its own dashboard
    env["RAY_API_SERVER_ADDRESS"] = cluster.dashboard_url
    try:
        # Its own temp dir: two nodes sharing one would share runtime_resources/, and each node's
        # runtime-env agent deletes the other's unpacked working dirs as unused (a job's cwd vanished).
        _ray(["--address", cluster.gcs_address, "--node-ip-address", WORKER_IP, "--temp-dir", cluster.temp_dir + "-w",
              *common, *_agent_ports()], env)
        _wait_for_nodes(cluster, 2)
    except Exception:
        stop_cluster(cluster)
        raise
    return cluster


def state_query(cluster: Cluster, code: str) -> object:
    """Run `code` (an expression over ray.util.state, with `address`) in a client process that
    has the cluster's token: the answer as JSON. (This process may hold another Ray's auth mode.)"""
    prog = ("import json; from ray.util import state; address = " + repr(cluster.dashboard_url)
            + "; print(json.dumps(" + code + "))")
    proc = subprocess.run([sys.executable, "-c", prog], env=cluster.env, capture_output=True, text=True, timeout=120)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _wait_for_nodes(cluster: Cluster, n: int, timeout: float = 120) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            if state_query(cluster, "sum(x.state == 'ALIVE' for x in state.list_nodes(address=address))") >= n:
                return
        except RuntimeError:  # the dashboard takes a few seconds to answer
            pass
        time.sleep(2)
    raise RuntimeError(f"the cluster did not reach {n} alive nodes in {timeout:.0f} s")


def stop_cluster(cluster: Cluster) -> None:
    pids = processes_under(cluster.temp_dir)  # the worker node's "<temp_dir>-w" matches too
    for sig in (signal.SIGTERM, signal.SIGKILL):
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.time() + 15
        while time.time() < deadline and any(_alive(p) for p in pids):
            time.sleep(0.3)
        pids = [p for p in pids if _alive(p)]
        if not pids:
            break
    for folder in (cluster.temp_dir, cluster.temp_dir + "-w"):
        shutil.rmtree(folder, ignore_errors=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie (reaped later by its parent) counts as gone
        with open(f"/proc/{pid}/stat") as fh:
            return fh.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False
