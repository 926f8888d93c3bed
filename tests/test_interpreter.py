"""iris/device/interpreter.py: under Triton's interpreter, a launch patches triton.language once and a
device function called from the kernel does not patch it again; the launch's end undoes every patch."""
import pytest
import torch
import triton
import triton.language as tl

import iris  # noqa: F401 (installs the patch where kernels are interpreted)
from iris.device import interpreter
from iris.device.aggregate import INTERPRETED

pytestmark = pytest.mark.skipif(not INTERPRETED, reason="kernels compile here: Triton's interpreter is not used")


@triton.jit
def _twice(x):
    return x * 2


@triton.jit
def _kernel(out, N: tl.constexpr):
    o = tl.arange(0, N)
    v = o.to(tl.float32)
    for _ in range(3):  # three nested calls per program
        v = _twice(v)
    tl.store(out + o, v)


def test_one_patch_per_launch_and_undone_after(monkeypatch):
    assert interpreter.install()
    original = interpreter._patch_lang.__defaults__[0]
    calls = []

    def counted(fn):
        calls.append(fn.__name__)
        return original(fn)

    monkeypatch.setattr(interpreter._patch_lang, "__defaults__", (counted,))
    load = tl.load
    out = torch.full((16,), -1.0)
    _kernel[(2,)](out, 16)
    assert torch.equal(out, torch.arange(16.0) * 8)
    assert calls == ["_kernel"], calls  # the launch only; six nested calls patched nothing
    assert tl.load is load and tl.core.is_builtin(tl.load)  # restored
    assert not interpreter._active
