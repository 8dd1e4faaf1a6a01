"""How worker.py loads the harness (env/eval/harness/README.md): its folder as the package
crucible_harness, loaded by path, whose modules import one another with relative imports in a fixed
order, each only from those before it, and none left in sys.modules once worker.py has bound what
it uses."""
import ast
import sys

import torch

from conftest import HARNESS_DIR, OWN_MODULES


def _tree(name):
    return ast.parse((HARNESS_DIR / (name + ".py")).read_text())


def test_own_modules_load_in_the_readme_order(worker, harness):
    assert tuple(harness) == OWN_MODULES
    assert worker._PACKAGE.MODULES == OWN_MODULES
    assert worker._PACKAGE.__name__ == "crucible_harness"
    assert worker._PACKAGE.__path__ == [str(HARNESS_DIR)]
    for name, mod in harness.items():
        assert mod.__name__ == "crucible_harness." + name
        assert mod.__file__ == str(HARNESS_DIR / (name + ".py"))
        assert getattr(worker._PACKAGE, name) is mod


def test_the_package_imports_its_modules_in_that_order():
    # __init__.py's relative imports: static_checks and confine first, then MODULES in order.
    tree = _tree("__init__")
    imported = [a.name for n in tree.body if isinstance(n, ast.ImportFrom) and n.level == 1 and not n.module
                for a in n.names]
    assert imported == ["static_checks", "confine", *OWN_MODULES]


def test_static_checks_and_confine_are_modules_of_the_package(worker):
    assert worker._STATIC_CHECKS_MODULE.__name__ == "crucible_harness.static_checks"
    assert worker._CONFINE.__name__ == "crucible_harness.confine"
    assert [n for n, _ in worker._HARNESS_NAMESPACES] == ["worker", "package", "static_checks", *OWN_MODULES]
    namespaces = dict(worker._HARNESS_NAMESPACES)
    assert namespaces["package"] is vars(worker._PACKAGE)
    assert all(namespaces[n] is vars(m) for n, m in worker._OWN_MODULES.items())


def test_no_harness_module_stays_importable_by_name(worker):
    assert not [n for n in sys.modules if n == "crucible_harness" or n.startswith("crucible_harness.")]
    assert str(HARNESS_DIR) not in sys.path_importer_cache
    assert str(HARNESS_DIR) not in sys.path


def test_each_module_imports_only_from_those_before_it():
    for i, name in enumerate(OWN_MODULES):
        used = set()
        for n in ast.walk(_tree(name)):
            if isinstance(n, ast.ImportFrom):
                assert n.level in (0, 1), f"{name}.py: an import from outside the package's folder"
                if n.level == 1:
                    used.add(n.module)
        later = used - set(OWN_MODULES[:i])
        assert not later, f"{name}.py imports from {sorted(later)}, loaded after it"


def test_no_module_imports_one_of_its_own_after_loading():
    # The package is out of sys.modules before any candidate code runs: a relative import inside a
    # function would fail there (and an absolute one of crucible_harness would find nothing).
    for name in ("__init__", "static_checks", "confine", *OWN_MODULES):
        tree = _tree(name)
        top = {id(n) for n in tree.body}
        for n in ast.walk(tree):
            if isinstance(n, ast.ImportFrom) and (n.level > 0 or (n.module or "").startswith("crucible_harness")):
                assert id(n) in top, f"{name}.py line {n.lineno}: an import of the harness's own below its top level"


def test_loading_touches_no_device(worker):
    assert not torch.cuda.is_initialized()
    assert worker._OWN_MODULES["device"]._kernels() is None
