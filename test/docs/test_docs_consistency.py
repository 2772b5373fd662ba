"""README.md and docs/ against the code: the README's size and what it may point at, the
settings tables against ``settings.SETTINGS``, and every link resolving."""

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
