"""The user documentation as data, for test/docs: README.md and docs/*.md, their fenced
code blocks, their tables and their links.

A fenced block opens with three backticks at the start of a line, followed by its info
string: a language, then words that say how the block is checked (test/docs says which
words it knows). It closes with three backticks alone. Fences are never indented, so
no block hides inside a list item where a reader (or this parser) might miss it.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Dict, Iterator, List, Tuple

from support.paths import REPO

FENCE = "```"


@dataclasses.dataclass(frozen=True)
class Block:
    path: str  # relative to the repository, e.g. "docs/settings.md"
    line: int  # the opening fence's line, from 1
    language: str  # the info string's first word ("" when there is none)
    tags: Tuple[str, ...]  # the info string's other words
    code: str

    @property
    def label(self) -> str:
        return f"{self.path}:{self.line}"


def documents() -> List[str]:
    """README.md, then every docs/*.md, relative to the repository."""
    docs = os.path.join(REPO, "docs")
    pages = sorted(f"docs/{name}" for name in os.listdir(docs) if name.endswith(".md")) if os.path.isdir(docs) else []
    return ["README.md", *pages]


def read(path: str) -> str:
    with open(os.path.join(REPO, path), encoding="utf-8") as file:
        return file.read()


def blocks(path: str) -> List[Block]:
    """Every fenced block of one document, in order; an unclosed fence is an error."""
    found, lines = [], read(path).splitlines()
    i = 0
    while i < len(lines):
        if not lines[i].startswith(FENCE):
            i += 1
            continue
        words = lines[i][len(FENCE):].split()
        start, i = i, i + 1
        body = []
        while i < len(lines) and lines[i].rstrip() != FENCE:
            body.append(lines[i])
            i += 1
        if i == len(lines):
            raise ValueError(f"{path}:{start + 1}: a code block that never closes")
        found.append(Block(path, start + 1, words[0] if words else "", tuple(words[1:]), "\n".join(body) + "\n"))
        i += 1
    return found


def all_blocks() -> List[Block]:
    return [block for path in documents() for block in blocks(path)]


def indented_fences(path: str) -> List[int]:
    """Lines (from 1) holding a fence that does not start the line."""
    return [n for n, line in enumerate(read(path).splitlines(), 1) if line.lstrip().startswith(FENCE) and not line.startswith(FENCE)]


def prose(path: str) -> str:
    """The document without its fenced blocks (where tables and links live)."""
    kept, inside = [], False
    for line in read(path).splitlines():
        if line.startswith(FENCE):
            inside = not inside
            continue
        if not inside:
            kept.append(line)
    return "\n".join(kept)


def tables(path: str) -> Iterator[List[Dict[str, str]]]:
    """Each table of a document as rows of {header: cell}; backticks around a cell dropped."""

    def cells(line: str) -> List[str]:
        return [cell.strip() for cell in line.strip().strip("|").split("|")]

    lines = prose(path).splitlines()
    for i in range(len(lines) - 1):
        if lines[i].startswith("|") and re.fullmatch(r"\|?(\s*:?-{3,}:?\s*\|)+\s*:?-*:?\s*\|?", lines[i + 1].strip()):
            if i > 0 and lines[i - 1].startswith("|"):
                continue  # not a header: the table started above
            header = [cell.lower() for cell in cells(lines[i])]
            rows = []
            for line in lines[i + 2:]:
                if not line.startswith("|"):
                    break
                rows.append({name: cell.strip("`") for name, cell in zip(header, cells(line))})
            yield rows


def lines_after_tables(path: str) -> List[Tuple[int, str]]:
    """(line, text), from 1, of the line right after each table's last row (a table that ends
    the document has none). GitHub's Markdown ends a table at a blank line only: any other
    line after its rows renders as one more row."""
    found, lines, inside = [], read(path).splitlines(), False
    for n, line in enumerate(lines, 1):
        if line.startswith(FENCE):
            inside = not inside
        elif not inside and line.startswith("|") and n < len(lines) and not lines[n].startswith("|"):
            found.append((n + 1, lines[n]))
    return found


LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def links(path: str) -> List[str]:
    """The targets of a document's inline links, outside code blocks."""
    return LINK.findall(prose(path))


def anchors(path: str) -> set:
    """The anchors GitHub gives a document's headings: lower case, punctuation dropped, spaces to hyphens."""
    found = set()
    for line in prose(path).splitlines():
        match = re.match(r"#+\s+(.*)", line)
        if match:
            text = match.group(1).strip().lower().replace("`", "")
            found.add(re.sub(r"\s", "-", re.sub(r"[^\w\- ]", "", text)))
    return found
