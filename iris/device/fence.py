"""Ordering a program's accesses around a flag at system scope, for every thread of the program.

A CTA barrier (tl.debug_barrier) orders the program's threads only relative to each other: a store of
one warp may still be on its way to memory (or, remote, over NVLink) when another thread's release
reaches a peer, and a load after another thread's acquire may still hit a stale line in this SM's L1.
So every thread fences its own accesses at sys scope: before the barrier that precedes a release
(_published) and after the barrier that follows an acquire (_acquired). Without it, at 4 ranks on
H100s a peer read zeros from a stage that another warp of the writer had not yet flushed
(docs/collectives.md, "Ordering").
"""
import torch
import triton
import triton.language as tl

from .. import settings

# Only NVIDIA's PTX is emitted here; the interpreter runs one program at a time and needs no fence. HIP
# keeps the release/acquire of the flag's own atomic.
_CUDA: tl.constexpr = tl.constexpr(torch.version.cuda is not None and not settings.INTERPRET.get())


@triton.jit
def _fence():
    """fence.acq_rel.sys in every thread of the program (on NVIDIA GPUs; nothing elsewhere)."""
    if _CUDA:
        tl.inline_asm_elementwise("fence.acq_rel.sys;\n\tmov.u32 $0, $1;", "=r,r", [tl.arange(0, 32)],
                                  dtype=tl.int32, is_pure=False, pack=1)


@triton.jit
def _published():
    """Every thread's earlier loads and stores are performed at sys scope, then the program meets: a
    release by any one thread afterwards covers them all."""
    _fence()
    tl.debug_barrier()


@triton.jit
def _acquired():
    """The program meets after one thread's acquire, then every thread orders its later accesses after
    it (no stale L1 line survives)."""
    tl.debug_barrier()
    _fence()
