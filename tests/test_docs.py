"""The README is a product page (at most 200 lines) and the docs' links lead somewhere: every relative link in the
README and docs/ names a file of the repository, and every #anchor a heading of the file it points into."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)  # a "# comment" in a code block is no heading
    return {slug(m.group(1)) for m in re.finditer(r"^#+ (.+)$", text, flags=re.M)}


def test_readme_fits_a_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


def test_relative_links_resolve() -> None:
    broken = []
    for doc in DOCS:
        for target in LINK.findall(doc.read_text()):
            if re.match(r"[a-z]+:", target):  # http(s):, mailto: ... are not the repository's
                continue
            file_part, _, anchor = target.partition("#")
            dest = (doc.parent / file_part).resolve() if file_part else doc
            if not dest.exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                broken.append(f"{doc.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_the_tests_the_docs_cite_exist() -> None:
    """A doc or docstring that names a test (`test_resume_on_another_world_size`, `tests/test_dmc.py`) names one that
    exists: a test renamed or merged takes its citations along."""
    tests = ROOT / "tests"
    names = {p.stem for p in tests.glob("test_*.py")}
    for path in tests.glob("*.py"):
        names |= set(re.findall(r"^def (test_\w+)", path.read_text(), flags=re.M))
    cited = [*DOCS, *(ROOT / "ppo_ddp").rglob("*.py"), *(ROOT / "scripts").glob("*.py")]
    missing = [f"{path.relative_to(ROOT)}: {name}" for path in cited
               for name in re.findall(r"\b(test_\w+)", path.read_text()) if name not in names]  # fmt: skip
    assert not missing, "\n".join(missing)


def test_slug_matches_github() -> None:
    assert slug("Tracking: Weights & Biases, TensorBoard's HParams") == "tracking-weights--biases-tensorboards-hparams"
    assert slug("Recurrent policies (`policy: gru`)") == "recurrent-policies-policy-gru"
