"""iris.load with every cache modifier, with and without volatile, on fp16/bf16/fp32/int32/int64.

ptxas rejects `ld.volatile` combined with `.ca` or `.cg` ("Modifier '.volatile' cannot be combined
with modifier '.cg'", Triton 3.6 and 3.9, sm_90): iris drops the cache modifier of a volatile load.
On the host the combinations are compiled for sm_90 (Triton ships ptxas, no GPU needed); on GPUs
two ranks read each other's data with every combination and check every element.
"""
import itertools
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton
import triton.language as tl

import iris

ROOT = Path(__file__).resolve().parents[1]
MODIFIERS = [".ca", ".cg", ".cv", "", None]
DTYPES = [torch.float16, torch.bfloat16, torch.float32, torch.int32, torch.int64]
N, BLOCK, POISON = 200, 64, 77

COMPILE = r'''
import itertools, sys
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
import iris

@triton.jit
def k(src, dst, hb, me, peer, n, CM: tl.constexpr, VOL: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    tl.store(dst + o, iris.load(src + o, me, peer, hb, o < n, 0, CM, VOL), mask=o < n)

failed = []
for dt in sys.argv[1].split(","):
    for cm, vol in itertools.product([".ca", ".cg", ".cv", "", None], [False, True]):
        sig = {"src": "*" + dt, "dst": "*" + dt, "hb": "*i64", "me": "i32", "peer": "i32", "n": "i32",
               "CM": "constexpr", "VOL": "constexpr", "BLOCK": "constexpr"}
        src = triton.compiler.ASTSource(k, sig, constexprs={"CM": cm, "VOL": vol, "BLOCK": 64})
        try:
            triton.compile(src, target=GPUTarget("cuda", 90, 32))
        except Exception as e:
            failed.append(f"{dt} cache_modifier={cm!r} volatile={vol}: " + str(e).splitlines()[0])
print("\n".join(failed) or "ALL COMPILED")
'''


def test_load_modifiers_compile_for_sm90(tmp_path):
    """Every cache_modifier x volatile compiles to sm_90 through ptxas (no GPU needed), 2 dtypes here."""
    script = tmp_path / "compile_loads.py"
    script.write_text(COMPILE)
    env = dict(os.environ, TRITON_INTERPRET="0", IRIS_PLATFORM="host",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, str(script), "fp16,i64"], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip().endswith("ALL COMPILED"), proc.stdout[-3000:]


@triton.jit
def _load_kernel(src, dst, hb, me, peer, n, CM: tl.constexpr, VOL: tl.constexpr, BLOCK: tl.constexpr):
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    tl.store(dst + o, iris.load(src + o, me, peer, hb, m, 0, CM, VOL), mask=m)


def _values(rank, dtype):
    return ((torch.arange(N) * 7 + rank * 13) % 91 - 45).to(dtype)


def _rank_main():
    ctx = iris.iris(1 << 22)
    try:
        me, w, dev = ctx.get_rank(), ctx.get_num_ranks(), ctx.get_device()
        peer, failures = (me + 1) % w, []
        for dtype in DTYPES:
            src = ctx.empty(N, dtype=dtype)
            src.copy_(_values(me, dtype).to(dev))
            ctx.barrier()
            for cm, vol in itertools.product(MODIFIERS, [False, True]):
                dst = torch.full((N,), POISON, dtype=dtype, device=dev)
                _load_kernel[(triton.cdiv(N, BLOCK),)](src, dst, ctx.get_heap_bases(), me, peer, N, CM=cm, VOL=vol,
                                                      BLOCK=BLOCK)
                if not torch.equal(dst.cpu(), _values(peer, dtype)):
                    failures.append(f"{dtype} cache_modifier={cm!r} volatile={vol} rank {me}: {dst[:6].tolist()}")
            ctx.barrier()
        return failures
    finally:
        ctx.close()


@pytest.mark.gpu
def test_load_modifiers_gpu():
    """Two ranks read each other's data with every cache_modifier x volatile x dtype."""
    failures = [f for r in iris.spawn(_rank_main, 2, timeout=600) for f in r]
    assert not failures, "\n".join(failures[:20])
