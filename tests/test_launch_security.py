"""Launching safely (docs/reliability.md): every torch.load is weights-only, our launch of several learners
listens on loopback only, two nodes meet through a c10d rendezvous, the Slurm example is valid bash."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import torch
import yaml
from launches import ROOT, TORCHRUN, Launch, assert_same_state, dump, process_tree, train_args
from test_train import read_csv


# --------------------------------------------------------------------------------------- 6: security
def test_every_torch_load_is_weights_only():
    import ast

    calls = []
    for path in [ROOT / "train.py", *(ROOT / "ppo_ddp").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "load"
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id == "torch"
            ):
                flags = {k.arg: k.value for k in node.keywords}
                ok = isinstance(flags.get("weights_only"), ast.Constant) and flags["weights_only"].value is True
                calls.append((f"{path.name}:{node.lineno}", ok))
    assert calls, "no torch.load found: the scan is broken"
    assert all(ok for _, ok in calls), [c for c, ok in calls if not ok]


def _listening_sockets(pids: set[int]) -> list[str]:
    """Local addresses of the TCP sockets in LISTEN state that these processes hold."""
    inodes = set()
    for pid in pids:
        try:
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with_link = os.readlink(f"/proc/{pid}/fd/{fd}")
                if with_link.startswith("socket:["):
                    inodes.add(with_link[8:-1])
        except OSError:
            continue
    found = []
    for table, family in (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6)):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                addr = bytes.fromhex(fields[1].split(":")[0])
                # /proc prints each 32-bit word in host (little-endian) order
                addr = b"".join(addr[i : i + 4][::-1] for i in range(0, len(addr), 4))
                found.append(socket.inet_ntop(family, addr))
    return found


def test_our_launch_of_several_learners_listens_on_loopback_only(tmp_path):
    # `python train.py --num-gpus 2` on a 2-GPU box takes this path; here on CPU.
    code = (
        "import sys; from ppo_ddp.configuration.topology import TrainingTopology; "
        "from ppo_ddp.runner.launch import launch_learners; "
        'launch_learners(TrainingTopology(2, 1, "cpu"), sys.argv[1:])'
    )
    run = Launch([sys.executable, "-c", code, *train_args(tmp_path, "l", 40)], tmp_path, "l", debug=tmp_path / "debug")
    run.wait_for_dump(1, 2)
    addresses = _listening_sockets(process_tree(run.proc.pid))
    os.kill(run.proc.pid, signal.SIGINT)  # Ctrl-C to the launcher: forwarded, the learners save and stop
    rc = run.wait()
    assert addresses, "no listening socket found: the probe is broken"
    assert set(addresses) <= {"127.0.0.1", "::1"}, addresses
    assert rc == 130, run.output()
    assert "stopped by SIGINT" in run.stdout and "Resume with: python train.py" in run.stdout, run.output()


# ------------------------------------------------------------------------------------- 7: two nodes
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_nodes_on_one_machine(tmp_path):
    """Two torchrun launches of one process each, meeting through a c10d rendezvous on 127.0.0.1."""
    port = _free_port()
    launcher = [
        *TORCHRUN,
        "--nnodes=2",
        "--nproc_per_node=1",
        "--rdzv-backend=c10d",
        f"--rdzv-endpoint=127.0.0.1:{port}",
        "--rdzv-id=two-nodes",
    ]
    args = train_args(tmp_path, "n", 4, "--obs-clip", "1e9")
    nodes = [Launch([*launcher, *args], tmp_path, f"node{n}", debug=tmp_path / "debug") for n in range(2)]
    for node in nodes:
        assert node.wait() == 0, node.output()
    rounds = [(dump(tmp_path / "debug", 0, i), dump(tmp_path / "debug", 1, i)) for i in range(0, 5)]  # 0: seeding
    a, b = rounds[0]
    assert (a["rank"], b["rank"], a["world_size"], b["world_size"]) == (0, 1, 2, 2)
    assert a["local_rank"] == b["local_rank"] == 0 and {a["node_rank"], b["node_rank"]} == {0, 1}
    seen = []
    for a, b in rounds:
        assert torch.equal(a["params"], b["params"])
        for d in (a, b):
            obs = d["obs"].reshape(-1, d["obs"].shape[-1]).double().numpy()
            frozen = d["frozen_obs_rms"]
            if frozen is not None:  # undo the actors' normalisation (obs_clip is huge: nothing was clipped)
                from ppo_ddp.models.normalization import EPSILON

                obs = obs * np.sqrt(frozen["var"].numpy() + EPSILON) + frozen["mean"].numpy()
            seen.append(obs)
        everything = np.concatenate(seen)
        assert_same_state(a["obs_rms"], b["obs_rms"], "statistics on both nodes")
        assert a["obs_rms"]["count"] == len(everything)
        np.testing.assert_allclose(a["obs_rms"]["mean"].numpy(), everything.mean(0), rtol=1e-4, atol=1e-5)
    saved = yaml.safe_load((tmp_path / "runs" / "n" / "config.yaml").read_text())
    assert saved["world_size"] == 2
    assert len(read_csv(tmp_path / "runs" / "n" / "metrics.csv")) == 4


def test_slurm_script_is_valid_bash():
    script = ROOT / "examples" / "slurm" / "train.sbatch"
    subprocess.run(["bash", "-n", str(script)], check=True, timeout=10)
    text = script.read_text()
    for needed in (
        "srun",
        "torchrun",
        "--rdzv-backend=c10d",
        "--nnodes",
        "GPUS_PER_NODE",
        "--ntasks-per-node=1",
        "--resume auto",
        "--run-name",
    ):
        assert needed in text, needed
