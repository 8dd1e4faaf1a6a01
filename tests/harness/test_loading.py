"""How worker.py loads the harness (env/harness/README.md): its modules by path, in a fixed order,
each importing only from those before it, and none left in sys.modules."""
import ast
import sys

import torch

from conftest import HARNESS_DIR, OWN_MODULES


def test_own_modules_load_in_the_readme_order(harness):
    assert tuple(harness) == OWN_MODULES
    for name, mod in harness.items():
        assert mod.__name__ == "crucible_harness_" + name
        assert mod.__file__ == str(HARNESS_DIR / (name + ".py"))


def test_static_checks_and_confine_load_under_their_own_names(worker):
    assert worker._STATIC_CHECKS_MODULE.__name__ == "crucible_static_checks"
    assert worker._CONFINE.__name__ == "crucible_confine"
    assert [n for n, _ in worker._HARNESS_NAMESPACES] == ["worker", "static_checks", *OWN_MODULES]


def test_no_harness_module_stays_importable_by_name(worker):
    assert not [n for n in sys.modules if n.startswith(("crucible_harness_", "crucible_static_checks"))]


def test_each_module_imports_only_from_those_before_it():
    for i, name in enumerate(OWN_MODULES):
        tree = ast.parse((HARNESS_DIR / (name + ".py")).read_text())
        used = {n.module.removeprefix("crucible_harness_") for n in ast.walk(tree)
                if isinstance(n, ast.ImportFrom) and n.module and n.module.startswith("crucible_harness_")}
        later = used - set(OWN_MODULES[:i])
        assert not later, f"{name}.py imports from {sorted(later)}, loaded after it"


def test_loading_touches_no_device(worker):
    assert not torch.cuda.is_initialized()
    assert worker._OWN_MODULES["device"]._kernels() is None
