"""README.md and docs/ against the code: the README's size and what it may point at, the
settings tables against ``settings.SETTINGS``, architecture.md's Notes against the Notes
the code defines, and every link resolving."""

from __future__ import annotations

import os
import re
import warnings

import pytest
from support import markdown
from support.paths import REPO

import torch_cudnn_handle as tch
from torch_cudnn_handle import settings

README_LINES = 250


def test_readme_is_short():
    lines = len(markdown.read("README.md").splitlines())
    assert lines <= README_LINES, f"README.md has {lines} lines; keep it at most {README_LINES} (the rest goes to docs/)"


def test_readme_points_only_inside_the_repository():
    text = markdown.read("README.md")
    outside = [target for target in markdown.links("README.md") if re.match(r"[a-z]+:", target) or target.startswith("/")]
    assert not outside, f"README.md links outside the repository: {outside}"
    for word in ("../", ".whl", "gpu-round", "GPU host"):
        assert word not in markdown.prose("README.md"), f"README.md mentions {word!r}"
    assert "../" not in text


def rendered_default(setting) -> str:
    """A default as the tables write it: a boolean as its variable's value (1 or 0)."""
    if setting.kind == "bool":
        return "1" if setting.default else "0"
    return str(setting.default)


def settings_table(path: str) -> list:
    for rows in markdown.tables(path):
        if rows and {"variable", "default", "meaning"} <= set(rows[0]):
            return rows
    raise AssertionError(f"{path} has no table with the columns variable, default and meaning")


@pytest.mark.parametrize("path", ["README.md", "docs/settings.md"])
def test_settings_table_is_settings_SETTINGS(path):
    rows = settings_table(path)
    expected = [(s.variable, rendered_default(s), s.meaning) for s in settings.SETTINGS]
    assert [(r["variable"], r["default"], r["meaning"]) for r in rows] == expected


def test_settings_page_names_every_setter_and_old_variable():
    text = markdown.read("docs/settings.md")
    for setting in settings.SETTINGS:
        assert f"set_{setting.name}" in text, setting.name
        for old in setting.old_variables:
            assert old in text, old
    for name in settings.__all__:
        if name.startswith("set_"):
            assert name in text, name


def test_every_table_ends_at_a_blank_line():
    """Else Markdown renders the next line as one more row (README.md's module table once took a paragraph so)."""
    run_on = [f"{path}:{line}: {text[:60]!r}" for path in markdown.documents() for line, text in markdown.lines_after_tables(path)
              if text.strip()]
    assert not run_on, "a table followed by a line that is not blank (add a blank line):\n" + "\n".join(run_on)


def test_every_link_resolves():
    broken = []
    for path in markdown.documents():
        for target in markdown.links(path):
            if re.match(r"[a-z]+:", target):
                continue  # a URL (README.md has none: test_readme_points_only_inside_the_repository)
            file, _, anchor = target.partition("#")
            resolved = os.path.normpath(os.path.join(REPO, os.path.dirname(path), file)) if file else os.path.join(REPO, path)
            if not resolved.startswith(REPO + os.sep) or not os.path.exists(resolved):
                broken.append(f"{path}: {target} (no such file)")
            elif anchor and resolved.endswith(".md") and anchor not in markdown.anchors(os.path.relpath(resolved, REPO)):
                broken.append(f"{path}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def test_readme_links_every_docs_page():
    linked = {os.path.normpath(target.partition("#")[0]) for target in markdown.links("README.md")}
    pages = [page for page in markdown.documents() if page.startswith("docs/")]
    assert pages, "docs/ has no pages"
    assert not [page for page in pages if page not in linked], "docs pages README.md does not link"


def test_the_old_names_the_docs_list_warn_at_the_callers_line():
    """docs/settings.md and docs/registering-graphs.md promise that an earlier release's
    name still works, with a DeprecationWarning. Python shows one by default only when it
    names the caller's own line (in a script, its module ``__main__``), so each must: here
    each call is a script line of its own, ``caller.py``."""
    calls = [
        "tch.register_graph(lambda g, x: g.relu(x), backward=lambda g, dy, x: [g.relu_backward(dy, x)])",
        "tch.register_graph(lambda g, x, *, k: g.relu(x), k=1)",
        "tch.pool_stats()",
    ]
    for call in calls:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            exec(compile(call, "caller.py", "exec"), {"tch": tch})
        deprecations = [w for w in caught if issubclass(w.category, DeprecationWarning)]
        assert deprecations and all(w.filename == "caller.py" for w in deprecations), (call, [(w.filename, str(w.message)) for w in caught])


NOTE_DEFINITION = re.compile(r"Note \[([^\]]+)\](?::|$)")  # "Note [Name]: ..." or a C++ "// Note [Name]" line


def _notes_in_the_code() -> dict:
    """{Note name: the files that define it}: a definition opens its explanation with a colon,
    or stands alone on its comment line (a citation runs on: "(Note [Name] in file.py)")."""
    found = {}
    for top in ("torch_cudnn_handle", "csrc"):
        for folder, _, files in os.walk(os.path.join(REPO, top)):
            for file in files:
                if file.endswith((".py", ".cpp", ".h")):
                    path = os.path.join(folder, file)
                    with open(path, encoding="utf-8") as source:
                        for line in source:
                            for name in NOTE_DEFINITION.findall(line.rstrip()):
                                found.setdefault(name, set()).add(os.path.relpath(path, REPO))
    return found


def test_architecture_lists_every_note_where_it_is():
    rows = next(rows for rows in markdown.tables("docs/architecture.md") if rows and "note" in rows[0])
    listed = {row["note"].strip("[]"): row["where"] for row in rows}
    in_code = _notes_in_the_code()
    assert set(listed) == set(in_code), f"Notes in the code, not listed: {sorted(set(in_code) - set(listed))}; listed, not in the code: {sorted(set(listed) - set(in_code))}"
    misplaced = {name: (where, sorted(in_code[name])) for name, where in listed.items() if where not in in_code[name]}
    assert not misplaced, misplaced
