"""Every relative link in the repository's documentation resolves: README.md, CONTRIBUTING.md, FINDINGS.md and
docs/**/*.md link (markdown links and images) only to files that exist, and `#anchor` links into markdown files
only to headings that exist (GitHub's heading anchors)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# [text](target) and ![alt](target); the target ends at whitespace or the closing parenthesis (an optional
# "title" after a space is ignored). Reference-style links are not used in these files.
LINK = re.compile(r"!?\[(?:[^\]\[]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")
FENCE = re.compile(r"^\s*(```|~~~)")


def documents(root: Path = ROOT) -> list[Path]:
    names = [root / n for n in ("README.md", "CONTRIBUTING.md", "FINDINGS.md")]
    return [p for p in names if p.exists()] + sorted((root / "docs").rglob("*.md"))


def _prose(text: str) -> list[tuple[int, str]]:
    """(line number, line) of the lines outside fenced code blocks."""
    lines, fenced = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if FENCE.match(line):
            fenced = not fenced
            continue
        if not fenced:
            lines.append((n, line))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: inline markup dropped, lower case, punctuation other than '-' and '_'
    removed, each space a '-'."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading anchors on its text
    text = text.replace("`", "").replace("*", "")
    text = re.sub(r"[^\w\- ]", "", text.lower())
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading anchor of a markdown file; a repeated heading gets -1, -2, ... as on GitHub, and an explicit
    <a id="..."> or <a name="..."> is an anchor too."""
    seen: dict[str, int] = {}
    out: set[str] = set()
    text = path.read_text(encoding="utf-8")
    for _, line in _prose(text):
        m = HEADING.match(line)
        if m:
            base = slug(m.group(1))
            k = seen.get(base, 0)
            seen[base] = k + 1
            out.add(base if k == 0 else f"{base}-{k}")
    out.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", text))
    return out


def broken_links(path: Path, root: Path = ROOT) -> list[str]:
    """'FILE:LINE: TARGET (why)' for each relative link in `path` that does not resolve."""
    problems = []
    for n, line in _prose(path.read_text(encoding="utf-8")):
        for target in LINK.findall(re.sub(r"`[^`]*`", "``", line)):  # a link inside inline code is code
            if re.match(r"^[a-z][a-z0-9+.-]*:", target, re.I):  # http:, https:, mailto: ...: not checked here
                continue
            file_part, _, anchor = target.partition("#")
            dest = path if not file_part else (path.parent / file_part).resolve()
            where = f"{path.relative_to(root)}:{n}: {target}"
            if not dest.exists():
                problems.append(f"{where} (no such file)")
            elif root.resolve() not in dest.resolve().parents and dest.resolve() != root.resolve():
                problems.append(f"{where} (outside the repository)")
            elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
                problems.append(f"{where} (no heading with anchor #{anchor})")
    return problems


def test_docs_relative_links_resolve():
    docs = documents()
    assert len(docs) > 5, [str(d) for d in docs]
    problems = [p for d in docs for p in broken_links(d)]
    assert not problems, "broken links:\n" + "\n".join(problems)


def test_docs_link_checker_reports_planted_broken_links(tmp_path):
    """The control: a document with a missing file, a missing heading and a link out of the tree is reported,
    link by link, while its good links (a file, a heading here and in another file, an image, a URL, a link in a
    code block) are not."""
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (root / "docs" / "other.md").write_text("# Other page\n\n## The k = m = 16 plan, +-0.25 %\n")
    (root / "docs" / "figure.png").write_bytes(b"")
    (tmp_path / "elsewhere.md").write_text("# Elsewhere\n")
    page = root / "docs" / "page.md"
    page.write_text(
        "# Page\n\n## A section: `code` and *emphasis*\n\n"
        "[ok](other.md) [ok](other.md#the-k--m--16-plan--025-) [ok](#a-section-code-and-emphasis) "
        "![ok](figure.png) [ok](https://example.org/missing.md)\n"
        "```\n[in code](missing-in-code.md)\n```\n"
        "[broken](missing.md) [broken](other.md#no-such-heading)\n"
        "[broken](#nowhere) [outside](../../elsewhere.md) `[in inline code](missing-inline.md)`\n")
    problems = broken_links(page, root=root)
    assert [p.split(": ", 1)[1] for p in problems] == [
        "missing.md (no such file)",
        "other.md#no-such-heading (no heading with anchor #no-such-heading)",
        "#nowhere (no heading with anchor #nowhere)",
        "../../elsewhere.md (outside the repository)",
    ], problems


def test_docs_heading_slugs_follow_github():
    assert slug("The convergence protocol: a verdict on validation loss that can fail") == (
        "the-convergence-protocol-a-verdict-on-validation-loss-that-can-fail")
    assert slug("Errors, exit codes and files written (`compare`, `calibrate`)") == (
        "errors-exit-codes-and-files-written-compare-calibrate")
    assert slug("torchao findings: upstream status and affected versions") == (
        "torchao-findings-upstream-status-and-affected-versions")
    assert slug("F1") == "f1"
