"""FirstImportHook: the code around a module's first import runs once, around
the module's own code, and the module keeps its real loader."""

import contextlib
import importlib
import importlib.util
import sys

import pytest

from tfdist.runtime.first_import import FirstImportHook


@pytest.fixture
def module_dir(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [n for n in sys.modules if n.startswith("tfdist_hooked_")]:
        del sys.modules[name]


@pytest.fixture
def said():
    """What the hook's block recorded; a module can read it as sys.modules['__said__']."""
    record = []
    sys.modules["__said__"] = record
    yield record
    del sys.modules["__said__"]


SAYS_WHAT_IT_SAW = "import sys\nSEEN = list(sys.modules['__said__'])\n"


def _recording(said):
    @contextlib.contextmanager
    def around():
        said.append("enter")
        yield
        said.append("exit")
    return around


def test_the_first_import_runs_inside_and_the_hook_leaves(module_dir, said):
    (module_dir / "tfdist_hooked_a.py").write_text(SAYS_WHAT_IT_SAW)
    hook = FirstImportHook("tfdist_hooked_a", _recording(said))
    assert hook.install() is True
    import tfdist_hooked_a
    assert tfdist_hooked_a.SEEN == ["enter"]  # the module's code ran inside the block
    assert said == ["enter", "exit"]
    assert hook not in sys.meta_path
    assert type(tfdist_hooked_a.__loader__).__name__ == "SourceFileLoader"
    assert tfdist_hooked_a.__spec__.loader is tfdist_hooked_a.__loader__
    assert hook.install() is False  # imported: nothing to hook any more
    assert hook not in sys.meta_path


def test_other_imports_pass_by_and_a_failing_import_still_removes_the_hook(module_dir, said):
    (module_dir / "tfdist_hooked_b.py").write_text("raise RuntimeError('broken module')\n")
    (module_dir / "tfdist_hooked_c.py").write_text("VALUE = 3\n")
    hook = FirstImportHook("tfdist_hooked_b", _recording(said))
    hook.install()
    import tfdist_hooked_c
    assert tfdist_hooked_c.VALUE == 3 and said == [] and hook in sys.meta_path
    with pytest.raises(RuntimeError, match="broken module"):
        importlib.import_module("tfdist_hooked_b")
    assert said == ["enter"] and hook not in sys.meta_path


def test_a_lookup_before_the_import_leaves_the_hook_for_the_import(module_dir, said):
    # TensorFlow looks Keras up (importlib.util.find_spec) before it imports it.
    (module_dir / "tfdist_hooked_d.py").write_text(SAYS_WHAT_IT_SAW)
    hook = FirstImportHook("tfdist_hooked_d", _recording(said))
    hook.install()
    spec = importlib.util.find_spec("tfdist_hooked_d")
    assert spec.origin == str(module_dir / "tfdist_hooked_d.py")
    assert "tfdist_hooked_d" not in sys.modules and said == [] and hook in sys.meta_path
    import tfdist_hooked_d
    assert tfdist_hooked_d.SEEN == ["enter"] and said == ["enter", "exit"]
    assert hook not in sys.meta_path
    assert type(tfdist_hooked_d.__loader__).__name__ == "SourceFileLoader"
