"""Synchronization between ranks inside kernels: signal/wait on flags, and the device barrier.

Every wait here is bounded by the spin limit the heap's tables carry (IRIS_SPIN_LIMIT when the context
was made; 0: for ever): a wait that runs out notes itself in the fault record (faults.py) and returns,
the kernel finishes, and the host raises WaitTimeout at its next ctx.barrier().
"""
import triton
import triton.language as tl

from . import indirect as _indirect
from .faults import DEVICE_BARRIER, SIGNAL, WAIT_FN, _gave_up, _spin_limit
from .near import INDIRECT_PEERS, _relax, _spin
from .translate import RANK_CHECK, _reach, _translate


@triton.jit
def signal(flag_ptr, value, from_rank, to_rank, heap_bases, op: tl.constexpr = None, sem: tl.constexpr = None,
           scope: tl.constexpr = None):
    """Sets (op="set", the default) or adds value to (op="add") the flag at flag_ptr on to_rank; returns the
    old value.

    flag_ptr: one int32/int64 flag, valid in from_rank's (the caller's) view of the heap;
    from_rank: the caller; to_rank: the rank whose flag changes; heap_bases: ctx.get_heap_bases().
    sem: "release" (the default) makes every write the caller made before visible to whoever
        acquires the flag; "acq_rel" also orders the caller's later accesses; "relaxed" orders nothing.
    scope: "sys" (the default) promises that ordering to other GPUs and the host; "gpu" to this
        device only, "cta" to this program only.
    """
    # defaults resolved here: Triton 3.6 cannot pass a str default into a nested jit function
    SEM: tl.constexpr = "release" if sem is None else sem
    SCOPE: tl.constexpr = "sys" if scope is None else scope
    tl.static_assert(op is None or op == "set" or op == "add", "op must be 'set' or 'add'")
    if INDIRECT_PEERS:
        return _indirect.signal(flag_ptr, value, from_rank, to_rank, heap_bases, op == "add", SEM, SCOPE)
    if RANK_CHECK:
        p, m = _reach(flag_ptr, from_rank, to_rank, heap_bases, None, SIGNAL)
        if op == "add":
            old = tl.where(m, tl.atomic_add(p, value, mask=m, sem=SEM, scope=SCOPE), 0)
        else:
            old = tl.where(m, tl.atomic_xchg(p, value, mask=m, sem=SEM, scope=SCOPE), 0)
    else:
        p = _translate(flag_ptr, from_rank, to_rank, heap_bases)
        if op == "add":
            old = tl.atomic_add(p, value, sem=SEM, scope=SCOPE)
        else:
            old = tl.atomic_xchg(p, value, sem=SEM, scope=SCOPE)
    return old


@triton.jit
def wait(flag_ptr, value, from_rank, to_rank, heap_bases, cmp: tl.constexpr = None, sem: tl.constexpr = None,
         scope: tl.constexpr = None):
    """Spins until `flag cmp value` holds for the flag at flag_ptr on to_rank; returns the flag's value.
    Gives up after the spin limit's polls (IRIS_SPIN_LIMIT when the context was made; 0: never): then it
    returns the last value read and the host raises WaitTimeout at its next ctx.barrier().

    flag_ptr: one int32/int64 flag, valid in from_rank's (the caller's) view; from_rank: the
    caller; to_rank: the rank whose flag is read (normally the caller); heap_bases:
    ctx.get_heap_bases(); cmp: "eq" (the default), "ne", "ge", "gt", "le" or "lt".
    sem: "acquire" (the default): what the signaller wrote before its release is visible after
        this returns; "relaxed" orders nothing. scope: "sys" (the default) to pair with a signal
        from another GPU, "gpu" within this device, "cta" within this program.
    Never wait on a flag that only another program of the same launch sets under the Triton
    interpreter: it runs programs one after another, so that would spin forever.
    """
    CMP: tl.constexpr = "eq" if cmp is None else cmp
    SEM: tl.constexpr = "acquire" if sem is None else sem
    SCOPE: tl.constexpr = "sys" if scope is None else scope
    if INDIRECT_PEERS:
        return _indirect.wait(flag_ptr, value, from_rank, to_rank, heap_bases, CMP, SEM, SCOPE)
    if RANK_CHECK:
        p, m = _reach(flag_ptr, from_rank, to_rank, heap_bases, None, WAIT_FN)
        return _spin(p, value, CMP, SEM, SCOPE, heap_bases, flag_ptr, from_rank, to_rank, WAIT_FN, m)
    return _spin(_translate(flag_ptr, from_rank, to_rank, heap_bases), value, CMP, SEM, SCOPE, heap_bases, flag_ptr,
                 from_rank, to_rank, WAIT_FN, None)


@triton.jit
def barrier_kernel(flags, rank, world, heap_bases, BLOCK: tl.constexpr):
    """A barrier of every rank that runs on the device: launch it with grid (1,) on every rank.

    flags: int64 heap tensor of world + 1 zeros, the same one on every rank (entry r: the last
        epoch rank r reached; entry world: this rank's own epoch count, kept on the device so
        that the launch can be replayed from a CUDA graph); rank, world: this rank and the number
        of ranks; heap_bases: ctx.get_heap_bases(); BLOCK: a power of two >= world.
    Each rank writes its new epoch into every rank's flags[rank] with release at "sys" scope,
    then spins with acquire until every entry of its own flags reaches that epoch: writes made
    before the barrier on any rank are visible after it on all. Gives up after the spin limit's polls
    (noting the first late rank for the host's WaitTimeout); the barrier then orders nothing.
    """
    epoch = tl.load(flags + world) + 1
    tl.debug_barrier()  # every warp has read the count before one thread overwrites it
    tl.store(flags + world, epoch)
    peers = tl.arange(0, BLOCK)
    live = peers < world
    if INDIRECT_PEERS:
        _indirect.announce(flags, rank, world, heap_bases, epoch)
    else:
        slots = _translate(flags + rank, rank, tl.where(live, peers, rank), heap_bases)
        tl.atomic_xchg(slots, tl.zeros([BLOCK], tl.int64) + epoch, mask=live, sem="release", scope="sys")
    limit = _spin_limit(heap_bases)
    pending = 1
    polls = 0
    while pending > 0:  # a scalar loop-carried value: Triton 3.6 mis-compiles a block one here
        seen = tl.atomic_add(flags + peers, 0, mask=live, sem="acquire", scope="sys")
        short = live & (seen < epoch)
        pending = tl.sum(short.to(tl.int32), axis=0)
        if pending > 0:
            _relax()
        polls += 1
        if (pending > 0) & (limit != 0) & (polls >= limit):
            late = tl.min(tl.where(short, peers, BLOCK), axis=0)
            _gave_up(heap_bases, DEVICE_BARRIER, flags + late, rank, rank, late, epoch,
                     tl.sum(tl.where(peers == late, seen, 0), axis=0), "ge")
            pending = 0
