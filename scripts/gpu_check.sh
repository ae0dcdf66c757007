#!/usr/bin/env bash
# The CUDA/NCCL paths on a GPU box, in one short run: NCCL process group (python train.py and torchrun),
# the learner on cuda:0, evaluation of a checkpoint written on the GPU, the refusal of
# more ranks than GPUs, and the suite itself with CUDA visible. Usage: OUT=/some/dir bash scripts/gpu_check.sh
# (GPU_CHECK_TESTS="tests/test_actors.py ..." runs part of the suite). Needs moviepy and an EGL driver for the videos.
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_check}
mkdir -p "$OUT"
small=(--env-id HalfCheetah-v5 --actors-per-gpu 4 --envs-per-actor 8 --rollout-length 64 --num-minibatches 32)
step() { echo; echo "=== $*"; }

step "devices"
nvidia-smi -L
python3 -c "import torch, sys; print(sys.version.split()[0], torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.device_count())"

step "python train.py on cuda:0 (NCCL, world of one), evaluating every 5 rounds with videos (EGL on the GPU)"
MUJOCO_GL=egl python3 train.py "${small[@]}" --total-timesteps 32768 --eval-interval 5 --capture-video \
    --runs-dir "$OUT/runs" --run-name py1 || echo "FAILED rc=$?"
grep -E "world_size|actors_per_learner" "$OUT/runs/py1/config.yaml"
cat "$OUT/runs/py1/eval.csv"
ls -la "$OUT/runs/py1/videos"

step "the Humanoid large-batch preset on cuda:0 in gradients mode: torchrun (NCCL through env://), the flat-gradient all_reduce, 3 rounds"
python3 -m torch.distributed.run --standalone --nproc_per_node=1 train.py --config ppo_ddp/configs/scale/humanoid.yaml \
    --sync-mode gradients --total-timesteps 16384 --runs-dir "$OUT/runs" --run-name hum || echo "FAILED rc=$?"
cut -d, -f1,2,6,11,12,13 "$OUT/runs/hum/metrics.csv"
cat "$OUT/runs/hum/eval.csv"

step "more ranks than GPUs is refused with one line, exit 2"
python3 -m torch.distributed.run --standalone --nproc_per_node=2 train.py --total-timesteps 4096 --runs-dir "$OUT/runs" --run-name tr2 2>&1 | grep "train.py: error"
echo "exit statuses: ${PIPESTATUS[0]}"

step "evaluate a checkpoint written on the GPU"
python3 -m ppo_ddp.evaluate "$OUT/runs/py1/model_py1.pt" --episodes 2 || echo "FAILED rc=$?"
MUJOCO_GL=egl python3 -m ppo_ddp.evaluate "$OUT/runs/py1/model_py1.pt" --episodes 1 --video "$OUT/video"; echo "video rc=$?"

step "PPO update of one default round, cpu vs cuda, eager vs compiled (the compile's seconds included once)"
python3 - <<'PY'
import time, torch
from ppo_ddp.configuration.config import Config
from ppo_ddp.algorithm.learner import Learner
from ppo_ddp.storage.batch import RolloutBatch
from ppo_ddp.models.mlp import ActorCritic
for dev in ("cpu", "cuda"):
    for compiled in (False, True):
        torch.set_num_threads(1)
        d = torch.device(dev)
        m = ActorCritic(17, 6).to(d); l = Learner(Config(), m, d)
        t = time.perf_counter()
        problem = l.compile(64) if compiled else None
        took = time.perf_counter() - t
        obs = torch.randn(2048, 17, device=d)
        with torch.no_grad(): a, lp, v = m.sample(obs)
        b = RolloutBatch(obs, a, lp, v, torch.randn(2048, device=d), torch.randn(2048, device=d))
        stats = lambda x: (x.mean().item(), x.std().item())
        l.train_step(b, stats)
        times = []
        for _ in range(5):
            if dev == "cuda": torch.cuda.synchronize()
            t = time.perf_counter(); l.train_step(b, stats)
            if dev == "cuda": torch.cuda.synchronize()
            times.append(time.perf_counter() - t)
        mode = f"compiled in {took:.1f} s" if compiled else "eager"
        print(f"{dev} {mode}: {min(times):.4f} s per round update (320 mini-batches, best of 5)"
              + (f"; did not compile: {problem}" if problem else ""))
PY

step "tests with CUDA visible (tests/test_actors.py checks the pinned buffers and the async copy): ${GPU_CHECK_TESTS:-tests}"
# shellcheck disable=SC2086  # GPU_CHECK_TESTS: the test files or folders to run (the whole suite by default)
python3 -m pytest -q -x ${GPU_CHECK_TESTS:-tests} 2>&1 | tail -15
