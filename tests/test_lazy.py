"""The packages' lazy faces (benchmark/lazy.py): a name loads its module on first use, and
importing a package imports none of torch, Ray or Optuna."""

import subprocess
import sys
import types

import pytest

from benchmark.lazy import lazy_face

FACES = ("benchmark", "benchmark.store", "benchmark.trial", "benchmark.search")


def test_a_name_loads_its_module_when_first_asked_for(monkeypatch):
    package = types.ModuleType("pkg_face")
    package.__getattr__, package.__dir__ = lazy_face("pkg_face", {"dumps": "inner"})
    inner = types.ModuleType("pkg_face.inner")
    inner.dumps = lambda: "from inner"
    monkeypatch.setitem(sys.modules, "pkg_face", package)
    monkeypatch.setitem(sys.modules, "pkg_face.inner", inner)
    assert package.dumps() == "from inner"
    assert "dumps" in dir(package)
    with pytest.raises(AttributeError, match="module 'pkg_face' has no attribute 'loads'"):
        package.loads


@pytest.mark.parametrize("face", FACES)
def test_every_exported_name_resolves(face):
    module = __import__(face, fromlist=["_"])
    for name in module.__all__:
        assert getattr(module, name) is not None, f"{face}.{name}"
    assert set(module.__all__) <= set(dir(module))


def test_importing_the_faces_imports_no_torch_ray_or_optuna():
    heavy = ("torch", "ray", "optuna")
    code = (
        "import sys\n"
        + "".join(f"import {face}\n" for face in FACES)
        + f"print(sorted(m for m in {heavy!r} if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
