"""A count that one thread advances is read by every warp first.

ctx.ccl's kernels keep each program's epoch on the device (counters[pid] + 1, stored back) and the
device barrier keeps its own; every thread reads the count, one thread stores the new value. Without
a CTA barrier between the two, a warp that reaches its read after that store takes the next call's
epoch: on GPUs (one rank each) it staged into the other parity of the stage and waited for flags a
call ahead, so peers read stale data or the call hung. The interpreter runs a program as one thread,
so the order is checked where it matters: in the PTX compiled for sm_90 on the host (Triton ships
ptxas; no GPU needed).
"""

from sm90_compile import compiled_output

COMPILE = r'''
import triton, triton.language as tl
from triton.backends.compiler import GPUTarget
from iris.ccl.kernels.common import _epoch
from iris.device.sync import barrier_kernel

@triton.jit
def epoch_kernel(counters, out):
    pid = tl.program_id(0)
    tl.store(out + pid, _epoch(counters, pid))

cases = (
    (epoch_kernel, {"counters": "*i64", "out": "*i64"}, {}),
    (barrier_kernel, {"flags": "*i64", "rank": "i32", "world": "i32", "heap_bases": "*i64", "BLOCK": "constexpr"},
     {"BLOCK": 4}),
)
for fn, sig, consts in cases:
    src = triton.compiler.ASTSource(fn, sig, constexprs=consts)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
    body = [l.strip() for l in ptx.splitlines() if l.strip().startswith(("ld.global", "st.global", "bar.sync", "@"))]
    body = [l.split(" ", 1)[1] if l.startswith("@") else l for l in body]
    first_store = next(i for i, l in enumerate(body) if l.startswith("st.global"))
    first_load = next(i for i, l in enumerate(body) if l.startswith("ld.global"))
    fenced = any(l.startswith("bar.sync") for l in body[first_load:first_store])
    print(fn.__name__, first_load < first_store, fenced)
'''


def test_every_warp_reads_the_count_before_it_is_stored(tmp_path):
    out = compiled_output(tmp_path / "compile_epochs.py", COMPILE)
    got = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert got == {"epoch_kernel": ["True", "True"], "barrier_kernel": ["True", "True"]}, out
