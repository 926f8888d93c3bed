"""The pipelined all_gather and all_to_all (pipelined_kernel in iris/ccl/kernels/pull.py) as compiled for
sm_90 on the host (Triton ships ptxas; no GPU needed): in the loop that reads a segment from the peers
while it stages the next, every load is issued before the first store, so the local copy's loads are in
flight beside the reads over the links (the reason for the pipelined form), and the accesses are 128-bit
where the sizes are multiples of 16 elements, as launches specialise them. The interpreter cannot show
either: it runs a program as one thread.
"""

from sm90_compile import compiled_output

COMPILE = r'''
import re
import triton
from triton.backends.compiler import GPUTarget
from iris.ccl.kernels.pull import pipelined_kernel as k

for mode in ("ag", "a2a"):
    consts = {"WORLD": 2, "PEERS": 2, "MODE": mode, "BLOCK": 8192, "SPIN": 1 << 28}
    sig = {a: "constexpr" if a in consts else "*bf16" if a in ("inp", "out", "stage") else
           "*i64" if a in ("flags", "counters", "heap_bases") else "i32" for a in k.arg_names}
    # every size a multiple of 16 elements (a pointer 16-byte aligned), as Triton specialises such launches
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(k.arg_names) if a not in consts and a != "rank"}
    src = triton.compiler.ASTSource(k, sig, constexprs=consts, attrs=aligned)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
    blocks = re.split(r"\n\$L__BB\d+_\d+:", ptx)
    step = max(blocks, key=lambda b: b.count("ld.global.v4"))  # the loop of the most wide loads
    ops = ["ld" if "ld.global.v4" in line else "st" for line in step.splitlines()
           if "ld.global.v4" in line or "st.global.v4" in line]
    last_load = max(i for i, o in enumerate(ops) if o == "ld")
    first_store = min(i for i, o in enumerate(ops) if o == "st")
    print(mode, ops.count("ld"), ops.count("st"), last_load < first_store)
'''


def test_pipelined_step_issues_every_load_before_a_store(tmp_path):
    out = compiled_output(tmp_path / "compile_pipelined.py", COMPILE)
    got = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert set(got) == {"ag", "a2a"}, out
    for mode, (loads, stores, ordered) in got.items():
        # ag: inp's block and the peer's (4 + 4 128-bit loads a thread); a2a: two of inp's column blocks and
        # the peer's (4 + 4 + 4); then every store
        assert int(loads) == {"ag": 8, "a2a": 12}[mode] and int(stores) == 12, (mode, loads, stores)
        assert ordered == "True", f"{mode}: a store comes before the step's last load"
