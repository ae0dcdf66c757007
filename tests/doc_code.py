"""The docs' code as data, for the tests that run it (tests/test_docs_code.py, the wheel's test in
tests/test_package.py) and check what it names: the fenced blocks and code spans of README.md and docs/, the commands
in them and the program each runs, and a Python block shortened the way a reader shortens a run."""

from __future__ import annotations

import ast
import csv
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```", flags=re.S | re.M)
SPAN = re.compile(r"(?<!`)`([^`\n]+)`(?!`)")

NOT_RUN = "# Not run by the tests:"
"""The first line of a Python block that no test executes, followed by the reason a reader sees (a fragment of
someone's control loop, a file that only an export makes)."""

SHORT_RUN = {"total_timesteps": 4096, "eval_interval": 0, "compile": False}
"""What a reader changes to try a block's `train(...)` in a minute: two rounds of the presets' 2048 steps, no
periodic evaluation, no compilation; every other field as the block has it."""


@dataclass(frozen=True)
class Block:
    doc: Path
    line: int  # of the opening fence
    lang: str
    text: str

    def __str__(self) -> str:
        return f"{self.doc.relative_to(ROOT)}:{self.line}"


def blocks(doc: Path, text: str | None = None) -> list[Block]:
    """The fenced blocks of a doc (or of `text`, a copy of it that a test changed)."""
    text = doc.read_text() if text is None else text
    return [
        Block(doc, text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2)) for m in FENCE.finditer(text)
    ]  # fmt: skip


def python_blocks() -> list[Block]:
    return [b for doc in DOCS for b in blocks(doc) if b.lang == "python"]


def code_spans(text: str) -> list[str]:
    """The inline `code` of a Markdown text, fenced blocks left out."""
    outside = FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    return SPAN.findall(outside)


def commands(text: str) -> list[list[str]]:
    """The shell commands of a block or span, split into words: continued lines joined, comments dropped, `&&`, `|`
    and `;` separating commands. Lines the shell could not parse (prose in a text block) give none."""
    found = []
    for line in text.replace("\\\n", " ").splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            continue
        command: list[str] = []
        for word in [*words, ";"]:
            if word in ("&&", "||", "|", ";"):
                found += [command] if command else []
                command = []
            else:
                command.append(word)
    return found


def program(command: list[str]) -> tuple[str | None, list[str]]:
    """(the ppo_ddp program or maintainer's script a command runs, its arguments), or (None, []) for another tool's:
    `python train.py`, `python -m ppo_ddp.evaluate`, `ppo-ddp-tune`, `torchrun ... train.py` and the Slurm template
    are `train` ... with ppo_ddp's flags after them; `python scripts/x.py` is `scripts/x.py` (examples/ likewise)."""
    while command and re.fullmatch(r"[A-Z_]+=\S*", command[0]):  # VAR=value before the program
        command = command[1:]
    head, rest = (command[0], command[1:]) if command else ("", [])
    if head in ("python", "python3"):
        if rest[:1] == ["-m"] and len(rest) > 1 and re.fullmatch(r"ppo_ddp\.\w+", rest[1]):
            return rest[1].removeprefix("ppo_ddp."), rest[2:]
        if rest[:1] == ["train.py"]:
            return "train", rest[1:]
        if rest and rest[0].startswith(("scripts/", "examples/")) and rest[0].endswith(".py"):
            return rest[0], rest[1:]
    if head.startswith("ppo-ddp-"):
        return head.removeprefix("ppo-ddp-"), rest
    if head in ("torchrun", "sbatch"):  # the launcher's own flags come first
        for i, word in enumerate(rest):
            if word in ("train.py", "examples/slurm/train.sbatch"):
                return "train", rest[i + 1 :]
            if word == "-m" and rest[i + 1 : i + 2] == ["ppo_ddp.train"]:
                return "train", rest[i + 2 :]
    return None, []


def shortened(source: str, fields: dict | None = None) -> str:
    """A Python block with every `train(...)` call given the keyword fields of SHORT_RUN (replacing the block's own),
    as a reader shortens a run to try it."""
    fields = SHORT_RUN if fields is None else fields
    tree = ast.parse(source)
    for node in train_calls(tree):
        node.keywords = [k for k in node.keywords if k.arg not in fields]
        node.keywords += [ast.keyword(arg=k, value=ast.Constant(v)) for k, v in fields.items()]
    return ast.unparse(ast.fix_missing_locations(tree))


def train_calls(tree: ast.AST) -> list[ast.Call]:
    """The `train(...)` and `ppo_ddp.train(...)` calls of a parsed block: each writes a run."""
    return [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.Call) and getattr(node.func, "id", getattr(node.func, "attr", None)) == "train"
    ]


def assert_finished_runs(runs: Path, expected: int) -> None:
    """`expected` runs under runs/, each with its final checkpoint and SHORT_RUN's steps in metrics.csv."""
    finished = [p for p in runs.glob("*/model_*.pt") if p.name == f"model_{p.parent.name}.pt"]  # not _best
    assert len(finished) == expected, sorted(runs.rglob("*"))
    for checkpoint in finished:
        with open(checkpoint.parent / "metrics.csv", newline="") as f:
            steps = max(int(r["global_step"]) for r in csv.DictReader(f))
        assert steps >= SHORT_RUN["total_timesteps"], (checkpoint, steps)
