"""The README is a product page (at most 110 lines, no commit hashes, its images small) and the docs' links lead
somewhere: every relative link in the README and docs/ names a file of the repository, and every #anchor a heading
of the file it points into."""

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


IMAGE = re.compile(r"!\[[^\]]*\]\(([^)\s]+)\)")
COMMIT = re.compile(r"\b(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}\b")  # hex with a letter and a digit


def test_readme_fits_a_page() -> None:
    assert len((ROOT / "README.md").read_text().splitlines()) <= 110


def test_the_readme_names_no_commit() -> None:
    """Dates, machines and commits live in docs/benchmarks, where each figure the README shows is dated."""
    assert not COMMIT.findall((ROOT / "README.md").read_text())


def test_the_readmes_images_exist_and_are_small() -> None:
    images = IMAGE.findall((ROOT / "README.md").read_text())
    assert len(images) >= 7  # six robots and the learning curves
    for image in images:
        path = ROOT / image
        assert path.is_file(), image
        assert path.stat().st_size <= 1_000_000, f"{image}: {path.stat().st_size} bytes"


def test_usage_opens_with_its_contents() -> None:
    """docs/usage.md lists every one of its sections, in order, before the first."""
    usage = ROOT / "docs" / "usage.md"
    text = usage.read_text()
    top = text.split("\n## ", 1)[0]
    listed = re.findall(r"^- \[[^\]]+\]\(#([^)]+)\)$", top, flags=re.M)
    body = re.sub(r"```.*?```", "", text, flags=re.S)
    assert listed == [slug(h) for h in re.findall(r"^## (.+)$", body, flags=re.M)]


def test_the_commit_pattern() -> None:
    assert COMMIT.findall("at d20df23 and 095fa17, seeds 1001472") == ["d20df23", "095fa17"]
    assert not COMMIT.findall("deadbeef 1234567 facade")


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
