"""reduce_scatter, and the pipelined all_gather, all_to_all, all_reduce and reduce (scatter_push_kernel in
iris/ccl/kernels/push.py) as compiled for sm_90 on the host (Triton ships ptxas; no GPU needed): every
access to the tensors is 128-bit where the sizes are multiples of 16 elements, as launches specialise
them, and each mode makes the accesses its design says. The interpreter cannot show either: it runs a
program as one thread.
"""

from sm90_compile import compiled_output

COMPILE = r'''
import re
import triton
from triton.backends.compiler import GPUTarget
from iris.ccl.kernels.push import scatter_push_kernel as k

# rd1: rank and root 1, which a launch compiles in as constants
for mode, world in (("ag", 2), ("a2a", 2), ("rs", 2), ("ar", 4), ("rd", 4), ("rd1", 4)):
    consts = {"WORLD": world, "PEERS": world, "MODE": mode.rstrip("1"), "OP": "sum", "IS_FLOAT": True, "BLOCK": 8192,
              "SPIN": 1 << 28, "IN_HEAP": False, "OUT_HEAP": True, **({"rank": 1, "root": 1} if mode == "rd1" else {})}
    sig = {a: "constexpr" if a in consts else "*bf16" if a in ("inp", "out", "stage") else
           "*i64" if a in ("flags", "counters", "heap_bases") else "i32" for a in k.arg_names}
    # every size a multiple of 16 elements (a pointer 16-byte aligned), as Triton specialises such launches
    aligned = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(k.arg_names) if a not in consts and a != "rank"}
    src = triton.compiler.ASTSource(k, sig, constexprs=consts, attrs=aligned)
    ptx = triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": 8}).asm["ptx"]
    acc = re.findall(r"\b(ld|st)\.global((?:\.\w+)*)", ptx)
    wide = [op for op, kind in acc if kind.endswith(".v4.b32")]
    narrow = sorted({op + kind for op, kind in acc if not kind.endswith(".v4.b32")})
    print(mode + str(world), wide.count("ld"), wide.count("st"), ",".join(narrow))
'''


def test_scatter_push_accesses_are_128_bit(tmp_path):
    out = compiled_output(tmp_path / "compile_scatter_push.py", COMPILE)
    got = {line.split()[0]: line.split()[1:] for line in out.splitlines()}
    assert set(got) == {"ag2", "a2a2", "rs2", "ar4", "rd4", "rd14"}, out
    # 8192 bf16 over 256 threads: 4 128-bit accesses a thread per block of one tensor. Segment 0's stores
    # before the loop, then the loop's step. ag: inp, own rows of out, the peer's slot (1 load, 2 stores),
    # then a slot of the stage into out and the same again (2 loads, 3 stores); a2a: the own and the
    # peer's column blocks (2, 2), then (3, 3); rs: the counts Triton makes of the reduce's own chunk and
    # slot, both branches kept as rank is a run-time value, beside the peer's chunk and out. ar and rd at 4
    # ranks: three peers each; rd stores its reduced block into the root only, where ar also stores it
    # into its own out (4 fewer); rd at the root (rank 1 = root 1) reduces nothing: its peers' chunks only
    want = {"ag2": (12, 20), "a2a2": (20, 20), "rs2": (20, 12), "ar4": (52, 40), "rd4": (52, 36), "rd14": (24, 24)}
    for mode, (loads, stores, narrow) in ((m, (v + [""])[:3]) for m, v in got.items()):
        assert (int(loads), int(stores)) == want[mode], (mode, loads, stores)
        # what is not 128-bit is int64: the heap bases, the epoch counter and a give-up's mark
        assert set(filter(None, narrow.split(","))) <= {"ld.b64", "st.b64"}, (mode, narrow)
