#!/usr/bin/env bash
# Sync against overlapped rounds (--overlap) with one learner on CUDA, in one short run on a GPU box: the default
# preset and the Humanoid large-batch preset as they are, then each with as many actors as the machine has cores
# for (the rollout a GPU box can make), each once with and once without --overlap. Prints one row per run: the
# training rate (charts/SPS of the last round: steps of the trained rounds over their time) and the mean rollout
# and update seconds of a round (charts/rollout_seconds is what the learner waited for its rollout: with --overlap,
# what the update did not hide).
# Usage: OUT=/some/dir bash scripts/gpu_overlap.sh   (docs/benchmarks/throughput.md has the results)
set -u
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/gpu_overlap}
mkdir -p "$OUT"
cores=$(nproc)
actors=$((cores > 4 ? cores - 2 : 2))  # a core each, two left for the learner and the system
nvidia-smi -L
python3 -c "import torch, mujoco, sys; print(sys.version.split()[0], torch.__version__, 'mujoco', mujoco.__version__, 'cuda', torch.cuda.is_available())"
echo "cores $cores; actors for the wide shape $actors"

row() {  # name, flags...
    local name=$1
    shift
    python3 train.py "$@" --eval-interval 0 --runs-dir "$OUT/runs" --run-name "$name" >"$OUT/$name.log" 2>&1 || {
        echo "$name FAILED"
        tail -5 "$OUT/$name.log"
        return
    }
    python3 - "$OUT/runs/$name/metrics.csv" "$name" <<'PY'
import csv, sys
rows = list(csv.DictReader(open(sys.argv[1])))
last, timed = rows[-1], rows[2:]  # the first trained rounds carry the compile's and the pool's warm-up
mean = lambda k: sum(float(r[k]) for r in timed) / len(timed)
print(f"{sys.argv[2]:<28} {float(last['charts/SPS']):>9,.0f} SPS  rollout {mean('charts/rollout_seconds'):.3f} s"
      f"  update {mean('charts/train_seconds'):.3f} s  ({len(rows)} rounds)", flush=True)
PY
}

echo "name                         training rate  per round (mean after 2 rounds)"
for overlap in "" "--overlap"; do
    tag=${overlap:+_overlap}
    row "default$tag" --total-timesteps 102400 $overlap
    row "default_wide$tag" --total-timesteps 204800 --actors-per-gpu "$actors" --envs-per-actor 8 --rollout-length 16 \
        $overlap
    row "humanoid$tag" --config scale/humanoid --total-timesteps 61440 $overlap
    row "humanoid_wide$tag" --config scale/humanoid --total-timesteps 286720 --actors-per-gpu "$actors" \
        --envs-per-actor 32 $overlap
done
