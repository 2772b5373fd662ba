"""Every code block of README.md and docs/*.md is complete and runs.

How a block is marked (its info string, after the three backticks):

* ```python: runs as it is, in a fresh interpreter of its own (a subprocess), here on a
  CPU too. Such blocks pick their device themselves (``"cuda" if torch.cuda.is_available()
  else "cpu"``: on CPU tensors the op runs the graph through its reference interpreter, so
  a block checks real numbers here too), and on a GPU machine the same block runs on cuDNN.
  A few run on ``meta`` tensors (shapes, strides and dtypes only) or on none.
* ```python gpu: needs a CUDA GPU; ``gpu two_gpus``, two; ``gpu dsl``, the CuTe DSL as
  well. The words are the suite's markers (pyproject.toml), so test/conftest.py's one
  skip rule skips these where that is missing, and the GPU suite runs them.
* ```bash ci: the commands .ci/run runs, line for line (checked, not run here:
  test_the_two_commands_are_what_ci_runs).
* ```bash, ```text: shown, not run.

A block runs with the working directory a temporary one, the library's environment
variables (TORCH_CUDNN_HANDLE_*) unset but for the plan store's directory and the tuning
file, which point into that directory, so a block sees the defaults a user has and never
writes into the home directory. A DeprecationWarning raised by the block's own code is an
error: the documentation uses today's names.
"""

from __future__ import annotations

import builtins
import os
import subprocess
import symtable
import sys

import pytest
from support import markdown

RUNNABLE = "python"
MARKERS = ("gpu", "two_gpus", "dsl")  # pyproject.toml's markers, the tags a python block may carry
SHOWN = ("bash", "text")
CI = "ci"  # the tag of the bash blocks that are .ci/run's commands
TIMEOUT_S = 600  # a GPU block may compile with inductor


def _python_blocks():
    params = []
    for block in markdown.all_blocks():
        if block.language == RUNNABLE:
            marks = [getattr(pytest.mark, tag) for tag in block.tags if tag in MARKERS]
            params.append(pytest.param(block, id=block.label, marks=marks))
    return params


def block_environment(tmp_path) -> dict:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_CUDNN_HANDLE_")}
    environment["TORCH_CUDNN_HANDLE_PLAN_STORE_DIR"] = str(tmp_path / "plans")
    environment["TORCH_CUDNN_HANDLE_TUNING_FILE"] = str(tmp_path / "plan_tuning.json")
    environment["PYTHONUNBUFFERED"] = "1"
    return environment


@pytest.mark.parametrize("block", _python_blocks())
def test_python_block_runs(block, tmp_path):
    script = tmp_path / "block.py"
    script.write_text(block.code)
    command = [sys.executable, "-X", "faulthandler", "-W", "error::DeprecationWarning:__main__", str(script)]
    result = subprocess.run(command, cwd=tmp_path, env=block_environment(tmp_path), capture_output=True, text=True,
                            timeout=TIMEOUT_S)
    assert result.returncode == 0, (
        f"{block.label} exited with {result.returncode}\n--- the block\n{block.code}--- stdout\n{result.stdout[-4000:]}"
        f"\n--- stderr\n{result.stderr[-8000:]}"
    )


def undefined_names(code: str) -> set:
    """Names a block reads that it never binds (nor are builtins): what would be a NameError
    when it runs. Module-level reads, and globals read inside its functions."""
    table = symtable.symtable(code, "block", "exec")
    bound = {s.get_name() for s in table.get_symbols() if s.is_assigned() or s.is_imported() or s.is_namespace()}
    missing = set()

    def walk(scope):
        for symbol in scope.get_symbols():
            module_level_read = scope.get_type() == "module" and symbol.is_referenced()
            if (module_level_read or (symbol.is_global() and symbol.is_referenced())) and symbol.get_name() not in bound:
                missing.add(symbol.get_name())
        for child in scope.get_children():
            walk(child)

    walk(table)
    return {name for name in missing if not hasattr(builtins, name)}


@pytest.mark.parametrize("block", [b for b in markdown.all_blocks() if b.language == RUNNABLE], ids=lambda b: b.label)
def test_python_block_compiles_and_defines_what_it_uses(block):
    """Checked here for every block, the GPU ones too: they run only where there is a GPU."""
    compile(block.code, block.label, "exec")
    assert not undefined_names(block.code), f"{block.label} uses names it never defines: {sorted(undefined_names(block.code))}"


def test_the_undefined_name_check_finds_one():
    assert undefined_names("import torch\ny = torch.relu(x)\n") == {"x"}
    assert undefined_names("def f():\n    return g\n") == {"g"}
    assert not undefined_names("import torch\nfor i in range(2):\n    print([j for j in range(i)])\n")


def test_every_block_says_how_it_is_checked():
    problems = []
    for block in markdown.all_blocks():
        if block.language == RUNNABLE:
            problems += [f"{block.label}: unknown tag {tag!r} (known: {MARKERS})" for tag in block.tags if tag not in MARKERS]
        elif block.language == "bash":
            problems += [f"{block.label}: unknown tag {tag!r}" for tag in block.tags if tag != CI]
        elif block.language not in SHOWN:
            problems.append(f"{block.label}: info string {block.language!r}; use python [gpu ...], bash [ci] or text")
    for path in markdown.documents():
        problems += [f"{path}:{line}: an indented fence (fences start their line)" for line in markdown.indented_fences(path)]
    assert not problems, "\n".join(problems)


def test_there_are_blocks_to_run():
    blocks = [b for b in markdown.all_blocks() if b.language == RUNNABLE]
    on_cpu = [b for b in blocks if not set(b.tags) & set(MARKERS)]
    assert len(blocks) >= 20 and len(on_cpu) * 2 > len(blocks), [b.label for b in blocks]


def test_readme_blocks_run_on_a_cpu():
    """README.md says its blocks run on a CPU too: none carries a tag that skips it there."""
    tagged = [f"{b.label}: {' '.join(b.tags)}" for b in markdown.blocks("README.md") if b.language == RUNNABLE and b.tags]
    assert not tagged, f"README.md's python blocks must run on a CPU (pick the device, as the others do): {tagged}"


def _ci_commands() -> list:
    """The command lines of .ci/run: what is neither the shebang, a comment, ``set`` nor ``cd``."""
    lines = markdown.read(".ci/run").splitlines()
    return [line.strip() for line in lines if line.strip() and not line.lstrip().startswith(("#", "set ", "cd "))]


def test_the_two_commands_are_what_ci_runs():
    readme = [line.strip() for b in markdown.blocks("README.md") if b.language == "bash" and CI in b.tags
              for line in b.code.splitlines() if line.strip()]
    assert readme == _ci_commands(), f"README.md's ```bash ci lines:\n{readme}\n.ci/run's commands:\n{_ci_commands()}"
    assert readme[-1] == "python -m pytest -q test"
    assert readme[0].endswith("python -m torch_cudnn_handle")
    others = [b.label for b in markdown.all_blocks() if b.path != "README.md" and CI in b.tags]
    assert not others, f"only README.md holds the ci commands: {others}"
