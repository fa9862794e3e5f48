"""A failing kernel's record message (core.errors.error_detail): the exception and where it was
raised, with paths as the package or library names them, so that a record reads the same on every
machine (a GPU machine's /tmp/site, a CI clone, a checkout) and diffs between them stay quiet."""
from __future__ import annotations

import os

import pytest

from rlx_conformance.core.errors import SpecError, _short_path, error_detail
from rlx_conformance.run import execute


def test_a_kernel_exception_names_its_type_message_and_last_frames_without_this_machine():
    def kernel():
        raise RuntimeError("[scatter] VJP not implemented for scatter_prod")

    with pytest.raises(RuntimeError) as info:
        kernel()
    msg = error_detail(info.value)
    assert msg.startswith("RuntimeError: [scatter] VJP not implemented for scatter_prod\n")
    assert 'in kernel\n    raise RuntimeError("[scatter] VJP' in msg
    assert os.path.dirname(os.path.dirname(os.path.abspath(__file__))) not in msg  # no checkout path


def test_an_rlx_error_is_its_message_alone():
    assert error_detail(SpecError("bad axis 3 for rank 2")) == "bad axis 3 for rank 2"


@pytest.mark.parametrize("entry,rel", [
    ("/tmp/site", "rlx_conformance/backends/mlx/__init__.py"),  # pip --target, on PYTHONPATH
    ("/tmp/mlx-site", "mlx/nn/layers/activations.py"),
    ("/work/venv/lib/python3.11/site-packages", "numpy/_core/fromnumeric.py"),
])
def test_paths_are_named_past_their_sys_path_entry(entry, rel, monkeypatch):
    monkeypatch.setattr("sys.path", ["/tmp", entry, "/usr/lib/python3.12"])
    assert _short_path(f"{entry}/{rel}") == rel  # the longest entry that holds it: not /tmp
    assert _short_path("/elsewhere/x.py") == "/elsewhere/x.py"
    assert _short_path("<string>") == "<string>"


def test_frames_are_named_by_their_module_the_same_from_a_checkout_as_from_an_install():
    """A checkout maps backends/ into the package (pyproject package-dir): its files must read
    rlx_conformance/backends/..., as an installed wheel's do, not backends/...."""
    from rlx_conformance.backends import cpu

    assert _short_path(cpu.__file__, cpu.__name__) == "rlx_conformance/backends/cpu/__init__.py"
    assert _short_path(execute.__file__, execute.__name__) == "rlx_conformance/run/execute.py"
    assert _short_path("/anywhere/mlx/nn/layers/activations.py", "mlx.nn.layers.activations") == \
        "mlx/nn/layers/activations.py"


def test_a_path_object_on_sys_path_does_not_break_the_record(monkeypatch):
    import pathlib
    monkeypatch.setattr("sys.path", [pathlib.Path("/tmp"), "/tmp/site"])
    assert _short_path("/tmp/site/pkg/mod.py") == "pkg/mod.py"
