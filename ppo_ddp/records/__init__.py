"""What a run leaves behind: its state in a checkpoint (run_state), when and what it saves and where it resumes
from (checkpointer), and rank 0's logs (run_log: TensorBoard, metrics.csv, eval.csv, the progress line)."""
