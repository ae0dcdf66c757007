"""Launching safely (docs/reliability.md): every torch.load is weights-only, our launch of several learners
listens on loopback only, the Slurm example is valid bash (two nodes meeting through a c10d rendezvous:
tests/test_reliability.py).

A launch of two learners costs ~10 s of CPU before its first round, so our launch's run also serves a test of
tests/test_overlap.py's, checked here: it trains an overlapped GRU with a privileged critic."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from launches import ROOT, Launch, dump, process_tree, train_args


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


PRIVILEGED = ["--env-id", "ppo_ddp/HopperNoVel-v5", "--critic-obs", "full_obs"]


@pytest.fixture(scope="module")
def our_launch(tmp_path_factory) -> tuple[Path, Launch, list[str], int]:
    """Our launch of two learners (`python train.py --num-gpus 2` on a 2-GPU box takes this path; here on CPU) of
    an overlapped GRU with a privileged critic, averaging gradients. Once rank 1 has dumped round 3, the launch's
    listening sockets are read, then Ctrl-C goes to the launcher alone. (tmp, the launch, the sockets' addresses, its
    exit status.) The rounds are tests/test_overlap.py's GRU test's, checked here: one launch for both."""
    tmp = tmp_path_factory.mktemp("launch")
    code = (
        "import sys; from ppo_ddp.configuration.topology import TrainingTopology; "
        "from ppo_ddp.runner.launch import launch_learners; "
        'launch_learners(TrainingTopology(2, 1, "cpu"), sys.argv[1:])'
    )
    gru = ["--policy", "gru", "--seq-length", "4", "--rnn-hidden-size", "8", "--hidden-sizes", "16"]
    flags = [*PRIVILEGED, "--overlap", "--sync-mode", "gradients", *gru]
    run = Launch([sys.executable, "-c", code, *train_args(tmp, "l", 40, *flags)], tmp, "l", debug=tmp / "debug")
    run.wait_for_dump(1, 3)
    addresses = _listening_sockets(process_tree(run.proc.pid))
    os.kill(run.proc.pid, signal.SIGINT)  # Ctrl-C to the launcher: forwarded, the learners save and stop
    return tmp, run, addresses, run.wait()


def test_our_launch_of_several_learners_listens_on_loopback_only(our_launch):
    _, run, addresses, rc = our_launch
    assert addresses, "no listening socket found: the probe is broken"
    assert set(addresses) <= {"127.0.0.1", "::1"}, addresses
    assert rc == 130, run.output()
    assert "stopped by SIGINT" in run.stdout and "Resume with: python train.py" in run.stdout, run.output()


def test_an_overlapped_gru_with_a_privileged_critic_acts_as_the_round_before_last_ranks_identical(our_launch):
    """(tests/test_overlap.py's, on this run.) A GRU's rollout (chunk states, episode starts) and the critic's own
    observations (HopperNoVel-v5's full_obs) through both rollout slots, 2 ranks averaging gradients, the privileged
    critic's included: each round acts with the weights of the round before the last (round 0 seeds the statistics
    and trains nothing), and the ranks stay bitwise identical."""
    debug = our_launch[0] / "debug"
    for k in (1, 2, 3):
        a, b = dump(debug, 0, k), dump(debug, 1, k)
        assert a["critic_obs"].shape[-1] == 11  # the privileged observation, beside the policy's five positions
        assert torch.equal(a["behaviour_params"], dump(debug, 0, max(k - 2, 0))["params"]), k
        assert torch.equal(a["params"], b["params"]), k


# ------------------------------------------------------------------------------------- 7: two nodes
# Two nodes on one machine meeting through a c10d rendezvous: tests/test_reliability.py, test_two_nodes_on_one_machine
# (the launch of its resume tests' uninterrupted run).


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
