"""The package's shape, as a maintainer relies on it: no import circle, no private name
imported across packages, every environment variable read in settings.py alone, and files
of a screen or two (a longer C++ file says why in its header)."""

import ast
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PACKAGE = os.path.join(ROOT, "torch_cudnn_handle")
PYTHON_LIMIT, CPP_LIMIT = 300, 250


def _modules():
    """{dotted module name: path} of every Python module of the package."""
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for file in files:
            if file.endswith(".py"):
                path = os.path.join(folder, file)
                parts = os.path.relpath(path, ROOT)[:-3].split(os.sep)
                found[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return found


MODULES = _modules()
EXTENSION = "torch_cudnn_handle._C"  # compiled (csrc/): imports nothing of the package


def _imports(name, path):
    """(imported module, imported name or None, line) for every import in a module, relative ones resolved."""
    package = name if path.endswith("__init__.py") else name.rpartition(".")[0]
    for node in ast.walk(ast.parse(open(path).read())):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name, None, node.lineno
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([node.module] if node.module else []))
            for alias in node.names:
                yield base, alias.name, node.lineno


def _edges():
    """module -> the package modules it imports (a name that is a submodule counts as that module)."""
    edges = {}
    for name, path in MODULES.items():
        targets = set()
        for module, imported, _ in _imports(name, path):
            candidate = f"{module}.{imported}" if imported else module
            if candidate in MODULES or candidate == EXTENSION:
                targets.add(candidate)
            elif module in MODULES:
                targets.add(module)
        edges[name] = targets - {name}
    edges[EXTENSION] = set()
    return edges


def test_no_import_circle():
    edges, state, path, circles = _edges(), {}, [], []

    def visit(module):
        state[module] = "open"
        path.append(module)
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target)
        path.pop()
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module)
    assert not circles, "import circles:\n" + "\n".join(" -> ".join(c) for c in circles)


def _subpackage(module):
    parts = module.split(".")
    return ".".join(parts[:2]) if len(parts) > 1 else parts[0]


ALLOWED_PRIVATE = {"torch_cudnn_handle._C", "torch_cudnn_handle._version", "torch_cudnn_handle._extension", "torch_cudnn_handle._deprecated"}


def _private_imports(name, path, own):
    """Underscore names ``name`` imports from a package other than ``own`` (ours, or the frontend's)."""
    for module, imported, line in _imports(name, path):
        if not module.split(".")[0] in ("torch_cudnn_handle", "cudnn"):
            continue
        names = module.split(".") + ([imported] if imported else [])
        target = f"{module}.{imported}" if imported else module
        if target in ALLOWED_PRIVATE or module in ALLOWED_PRIVATE:
            continue
        if any(part.startswith("_") and part != "__future__" for part in names) and _subpackage(module) != own:
            yield f"{os.path.relpath(path, ROOT)}:{line}: {target}"


def test_no_private_name_is_imported_across_packages():
    found = [hit for name, path in MODULES.items() for hit in _private_imports(name, path, _subpackage(name))]
    for folder in ("test", "bench", "examples"):
        for top, _, files in os.walk(os.path.join(ROOT, folder)):
            for file in files:
                if file.endswith(".py"):
                    found += _private_imports(file[:-3], os.path.join(top, file), own=None)
    assert not found, "private names imported across packages:\n" + "\n".join(found)


def test_every_environment_variable_is_read_in_settings_alone():
    """The library's own variables (and the frontend's it reads) are read by settings.py alone;
    other modules may name CUDA's or the loader's variables in a diagnosis (the main job, a
    no-GPU error message)."""
    ours = re.compile(r"(environ|getenv)[^\n]*(TORCH_CUDNN_HANDLE_|CUDNN_FRONTEND_)")
    readers = [os.path.relpath(p, ROOT) for n, p in MODULES.items() if n != "torch_cudnn_handle.settings" and ours.search(open(p).read())]
    for top, _, files in os.walk(os.path.join(ROOT, "csrc")):
        readers += [os.path.relpath(os.path.join(top, f), ROOT) for f in files if ours.search(open(os.path.join(top, f)).read())]
    assert not readers, f"environment variables read outside torch_cudnn_handle/settings.py: {readers}"


def test_files_are_a_screen_or_two():
    long = [f"{os.path.relpath(p, ROOT)}: {n} lines" for p in MODULES.values() if (n := len(open(p).readlines())) > PYTHON_LIMIT]
    for top, _, files in os.walk(os.path.join(ROOT, "csrc")):
        for file in files:
            path = os.path.join(top, file)
            lines = open(path).readlines()
            header = "".join(lines[:12])
            if len(lines) > CPP_LIMIT and f"longer than {CPP_LIMIT} lines" not in header:
                long.append(f"{os.path.relpath(path, ROOT)}: {len(lines)} lines, and its header does not say why")
    assert not long, "\n".join(long)


@pytest.mark.parametrize("name", sorted(n for n in MODULES if not n.endswith("__main__")))
def test_each_module_opens_by_naming_what_it_owns(name):
    tree = ast.parse(open(MODULES[name]).read())
    assert ast.get_docstring(tree), f"{name} has no module docstring"


def test_no_module_imports_from_the_packages_init():
    """``__init__.py`` is only the package's face: a module takes the extension from
    ``_extension.py`` and each name from the module that owns it, never from the package."""
    found = []
    for name, path in MODULES.items():
        for module, imported, line in _imports(name, path):
            if module == "torch_cudnn_handle" and imported and f"torch_cudnn_handle.{imported}" not in MODULES and name != "torch_cudnn_handle":
                found.append(f"{os.path.relpath(path, ROOT)}:{line}: {imported}")
    assert not found, "names imported from torch_cudnn_handle/__init__.py:\n" + "\n".join(found)


def _calls_the_op(source: str) -> bool:
    """Whether code (not docstrings) reaches ``torch.ops.cudnn_fe`` or the extension's entries ``_C.execute*``."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and (node.attr == "cudnn_fe" or (
                node.attr.startswith("execute") and isinstance(node.value, ast.Name) and node.value.id == "_C")):
            return True
    return False


def test_the_registry_never_calls_the_op_and_the_op_uses_the_registrys_face():
    """One direction: op -> registry (its face, registry/__init__.py), never back."""
    climbs, deep = [], []
    for name, path in MODULES.items():
        text = open(path).read()
        if name.startswith("torch_cudnn_handle.registry"):
            if _calls_the_op(text) or any(
                    m.startswith(("torch_cudnn_handle.op", "torch_cudnn_handle.nn")) for m, _, _ in _imports(name, path)):
                climbs.append(os.path.relpath(path, ROOT))
        if name.startswith("torch_cudnn_handle.op"):
            for module, imported, line in _imports(name, path):
                target = f"{module}.{imported}" if imported else module
                if module.startswith("torch_cudnn_handle.registry.") or (module == "torch_cudnn_handle.registry" and target in MODULES):
                    deep.append(f"{os.path.relpath(path, ROOT)}:{line}: {target}")
    assert not climbs, f"registry modules that call the op or import from above: {climbs}"
    assert not deep, "op modules importing the registry's modules instead of its face:\n" + "\n".join(deep)


def test_the_settings_a_route_reads_are_read_by_routes_py_alone():
    """Note [One route per call]: registry/routes.py's ``Resolved`` reads them once per
    decision; no other module decides on them (stats report the verify setting's value)."""
    import dataclasses

    from torch_cudnn_handle.registry.routes import Resolved

    names = "|".join(f.name for f in dataclasses.fields(Resolved))
    reads = re.compile(rf'(settings\.(get|resolve)\(\s*"({names})"|tuning_enabled|dynamic_shapes_enabled|plan_store\.enabled)')
    reports = {"torch_cudnn_handle/op/verify.py": 1}  # stats.verify()["enabled"]: a report, never a decision
    found = {}
    for name, path in MODULES.items():
        relative = os.path.relpath(path, ROOT)
        if name not in ("torch_cudnn_handle.settings", "torch_cudnn_handle.registry.routes"):
            count = len(reads.findall(open(path).read()))
            if count > reports.get(relative, 0):
                found[relative] = count
    assert not found, f"route settings read outside registry/routes.py: {found}"
