"""Put a trained policy in the repository, as the README's robots were:

    python scripts/ship_policy.py runs/<run>/model_<run>.pt halfcheetah --trained-by "python train.py --seed 3"

writes policies/<name>.pt (`python -m ppo_ddp.export CKPT --format policy`: the policy alone, run it from the
repository's root so that a robot's own MJCF file travels as a path inside it), plays it for EPISODES deterministic
episodes on evaluate's seeds, renders the first one's start as docs/media/<name>.gif (`python -m ppo_ddp.evaluate
--gif`), and records the episodes' mean, min and max with how the policy was trained in policies/policies.csv (a
row per name, replaced when shipped again). tests/test_policies.py plays every row's file again and checks it
scores within that range.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from ppo_ddp.envs.video import choose_gl  # noqa: E402
from ppo_ddp.evaluation.playback import evaluate_policy, load_policy  # noqa: E402
from ppo_ddp.export import write_policy_file  # noqa: E402

POLICIES = ROOT / "policies"
MANIFEST = POLICIES / "policies.csv"
MEDIA = ROOT / "docs" / "media"
EPISODES = 10
FIELDS = ("name", "env_id", "file", "gif", "global_step", "trained_by", "commit", "episodes", "mean", "min", "max")


def read_manifest(path: Path = MANIFEST) -> list[dict[str, str]]:
    if not path.exists():
        return []
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def ship(checkpoint: Path, name: str, trained_by: str, commit: str) -> dict[str, str]:
    """The policy file, its evaluation and its GIF; returns its manifest row."""
    policy_file, gif = POLICIES / f"{name}.pt", MEDIA / f"{name}.gif"
    slim = write_policy_file(checkpoint, policy_file)
    choose_gl()  # rendering without a display: EGL unless MUJOCO_GL says otherwise
    model, obs_rms, cfg = load_policy(policy_file)
    returns = evaluate_policy(model, obs_rms, cfg, EPISODES, gif_path=str(gif))
    return {
        "name": name,
        "env_id": cfg.env_id,
        "file": str(policy_file.relative_to(ROOT)),
        "gif": str(gif.relative_to(ROOT)),
        "global_step": str(slim.get("global_step", "")),
        "trained_by": trained_by,
        "commit": commit,
        "episodes": str(EPISODES),
        "mean": f"{sum(returns) / len(returns):.1f}",
        "min": f"{min(returns):.1f}",
        "max": f"{max(returns):.1f}",
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("checkpoint", type=Path)
    p.add_argument("name", help="the file's name under policies/ and docs/media/, without its suffix")
    p.add_argument("--trained-by", required=True, help="the command that trained the checkpoint")
    p.add_argument("--commit", default="", help="the code that trained it (the run's returns.csv row says)")
    args = p.parse_args()
    row = ship(args.checkpoint, args.name, args.trained_by, args.commit)
    rows = [r for r in read_manifest() if r["name"] != args.name] + [row]
    with open(MANIFEST, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=FIELDS)
        writer.writeheader()
        writer.writerows(sorted(rows, key=lambda r: r["name"]))
    gif_kib = (ROOT / row["gif"]).stat().st_size / 1024
    print(f"{row['file']}: {row['env_id']} {row['mean']} [{row['min']}, {row['max']}] over {EPISODES}; "
          f"{row['gif']} {gif_kib:.0f} KiB")  # fmt: skip


if __name__ == "__main__":
    main()
