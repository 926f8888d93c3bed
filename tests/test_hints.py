"""rma's `hint` reaches the compiled kernel: 128-bit accesses on the remote side of load, store, get,
put and copy where the caller passes hint=BLOCK, none without it (the control).

Triton keeps tl.multiple_of/max_contiguous only on a value that an operation of the same function
produced; applied to an argument of an inlined helper it is silently dropped, and every access stays
32-bit. The kernels are compiled for sm_90 on the host (Triton ships ptxas; no GPU needed), with a tile
start the compiler cannot prove aligned, so only the hint can make the accesses wide.
"""

import pytest
from sm90_compile import compiled_output

# One pytest-xdist worker runs this module: its module fixture compiles every case once.
pytestmark = pytest.mark.xdist_group("test_hints")

COMPILE = r'''
import sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
import iris

@triton.jit
def k(src, dst, hb, me, peer, start, OP: tl.constexpr, HINT: tl.constexpr, BLOCK: tl.constexpr):
    o = start + tl.arange(0, BLOCK)
    if OP == "load":
        tl.store(dst + o, iris.load(src + o, me, peer, hb, hint=HINT))
    elif OP == "store":
        iris.store(dst + o, tl.load(src + o), me, peer, hb, hint=HINT)
    elif OP == "get":
        iris.get(src + o, dst + o, me, peer, hb, hint=HINT)
    elif OP == "put":
        iris.put(src + o, dst + o, me, peer, hb, hint=HINT)
    else:
        iris.copy(src + o, dst + o, peer, peer, me, hb, hint=HINT)  # both sides remote

sig = {"src": "*fp32", "dst": "*fp32", "hb": "*i64", "me": "i32", "peer": "i32", "start": "i32",
       "OP": "constexpr", "HINT": "constexpr", "BLOCK": "constexpr"}
for op in ("load", "store", "get", "put", "copy"):
    for hint in (256, None):
        src = triton.compiler.ASTSource(k, sig, constexprs={"OP": op, "HINT": hint, "BLOCK": 256})
        ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 2}).asm["ptx"]
        print(op, hint, ptx.count("ld.global.v4"), ptx.count("st.global.v4"))
'''

# (128-bit loads, 128-bit stores) each call must have with hint=256: the remote side only (a local
# pointer, or a side whose ranks are the caller's own, keeps what the calling kernel declares)
WIDE = {"load": (True, False), "store": (False, True), "get": (True, False), "put": (False, True),
        "copy": (True, True)}


@pytest.fixture(scope="module")
def counts(tmp_path_factory):
    stdout = compiled_output(tmp_path_factory.mktemp("hints") / "compile_hints.py", COMPILE)
    out = {}
    for line in stdout.splitlines():
        op, hint, loads, stores = line.split()
        out[op, hint] = (int(loads) > 0, int(stores) > 0)
    return out


@pytest.mark.parametrize("op", sorted(WIDE))
def test_hint_widens_the_remote_access(counts, op):
    assert counts[op, "256"] == WIDE[op], f"{op} with hint=256: (128-bit loads, stores) = {counts[op, '256']}"
    assert counts[op, "None"] == (False, False), f"{op} without a hint: {counts[op, 'None']} (the control)"
