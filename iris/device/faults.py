"""The fault record: the first rank outside [0, world) that a device function refused, or the first device
wait that gave up, noted by the kernel and raised by the host at its next synchronising call.

What matters:
- Kernels find it through hidden int64 entries just before heap_bases[0] (translate.bases_table):
  [record, spin limit, MAGIC, heap size, rank, world] at heap_bases[-6] .. [-1]. record is the address
  of the heap's record (SLOTS int64 on its device; 0: none), spin limit the most polls of a device
  function's wait (IRIS_SPIN_LIMIT when the heap was made; 0: for ever). No device function's
  signature carries them, so heap_bases must be ctx.get_heap_bases() (or a DeviceContext's table, or
  an address map's), never a copy.
- First wins: every fault adds 1 to record[0], and the one that found 0 writes the details. Nothing
  here runs before a fault (a cold branch), except reading the spin limit before a wait.
- The host reads the record where it has synchronised anyway (ctx.barrier(), ctx.ccl.free(),
  ctx.close()), raises once (DeviceCheckError for a rank, WaitTimeout for a wait) and clears it.
"""
import triton
import triton.language as tl

from ..errors import DeviceCheckError, WaitTimeout

MAGIC: tl.constexpr = tl.constexpr(0x1215DEB6)
HIDDEN = 6  # record, spin limit, MAGIC, heap size, rank, world: at heap_bases[-6] .. [-1]
RECORD_AT: tl.constexpr = tl.constexpr(-6)
SPIN_AT: tl.constexpr = tl.constexpr(-5)
MAGIC_AT: tl.constexpr = tl.constexpr(-4)
WORLD_AT: tl.constexpr = tl.constexpr(-1)
SLOTS = 16  # count, kind, what, then the kind's values (RANK_FIELDS, WAIT_FIELDS)

RANK: tl.constexpr = tl.constexpr(1)  # a rank outside [0, world): from_rank, to_rank, world
WAIT: tl.constexpr = tl.constexpr(2)  # a wait gave up: waiting rank, flag's rank, peer, flag address,
#                                       awaited value, last value seen, comparison
RANK_FIELDS = ("from_rank", "to_rank", "world")
WAIT_FIELDS = ("rank", "flag_rank", "peer", "address", "value", "seen", "cmp")

# What faulted: the device function (or iris's own wait), by its code in the record.
NAMES = ("load", "store", "get", "put", "copy", "atomic_add", "atomic_sub", "atomic_cas", "atomic_xchg", "atomic_and",
         "atomic_or", "atomic_xor", "atomic_min", "atomic_max", "signal", "wait", "ctx.device_barrier",
         "the tile API's lock (all_reduce_spinlock)", "ctx.ccl.all_reduce (spinlock)'s lock")
(LOAD, STORE, GET, PUT, COPY, ATOMIC_ADD, ATOMIC_SUB, ATOMIC_CAS, ATOMIC_XCHG, ATOMIC_AND, ATOMIC_OR, ATOMIC_XOR,
 ATOMIC_MIN, ATOMIC_MAX, SIGNAL, WAIT_FN, DEVICE_BARRIER, TILE_LOCK, CCL_LOCK) = (
    tl.constexpr(i + 1) for i in range(len(NAMES)))
CMPS = ("eq", "ne", "ge", "gt", "le", "lt")  # a wait's comparison, by its index in the record


@triton.jit
def _note(heap_bases, KIND: tl.constexpr, WHAT: tl.constexpr, a, b, c, d, e, f, g):
    """Notes a fault of KIND (RANK or WAIT) by WHAT with its values a .. g (RANK_FIELDS, WAIT_FIELDS) in the
    record heap_bases points to, unless an earlier fault was noted there first; a table without a
    record (0) notes nothing. A cold path: callers reach it only once a fault happened."""
    at = tl.load(heap_bases + RECORD_AT)
    if at != 0:
        rec = at.to(tl.pointer_type(tl.int64))
        if tl.atomic_add(rec, 1, sem="relaxed", scope="gpu") == 0:
            tl.store(rec + 1, KIND)
            tl.store(rec + 2, WHAT)
            tl.store(rec + 3, a)
            tl.store(rec + 4, b)
            tl.store(rec + 5, c)
            tl.store(rec + 6, d)
            tl.store(rec + 7, e)
            tl.store(rec + 8, f)
            tl.store(rec + 9, g)


@triton.jit
def _spin_limit(heap_bases):
    """The most polls a device function's wait makes (0: for ever): the hidden entry, where heap_bases
    is iris's table (a copy has no hidden entries, and then waits are not bounded)."""
    ours = tl.load(heap_bases + MAGIC_AT) == MAGIC
    return tl.where(ours, tl.load(heap_bases + SPIN_AT), 0).to(tl.int32)


@triton.jit
def _gave_up(heap_bases, WHAT: tl.constexpr, flag, rank, flag_rank, peer, value, seen, CMP: tl.constexpr):
    """Notes that WHAT, waiting on rank's behalf for the flag at `flag` (a pointer in rank's view of the heap,
    on flag_rank) to compare CMP to value, gave up having last read seen; peer: the rank that should have
    set it (-1: not known)."""
    CODE: tl.constexpr = 0 if CMP == "eq" else 1 if CMP == "ne" else 2 if CMP == "ge" else 3 if CMP == "gt" else \
        4 if CMP == "le" else 5  # its index in CMPS
    _note(heap_bases, WAIT, WHAT, rank, flag_rank, peer, flag.to(tl.int64), value, seen, CODE)


# -- the host's side -------------------------------------------------------------------------------
def new_record(device):
    """A heap's record: SLOTS zeroed int64 on its device."""
    import torch
    return torch.zeros(SLOTS, dtype=torch.int64, device=device)


def raise_noted(record, rank: int, where=None, spin: int = 0) -> None:
    """Raise the fault noted in record (one device-to-host read), if any, and clear it so that it is raised
    once. rank: this rank; where(address) names what a flag address is in the heap (or None); spin: the
    spin limit the heap's tables carry. The device must be synchronised first."""
    got = record.tolist()
    if not got[0]:
        return
    record.zero_()
    count, kind, what = got[0], got[1], got[2]
    name = NAMES[what - 1] if 0 < what <= len(NAMES) else f"device function {what}"
    more = f" ({count - 1} more faults followed; this is the first)" if count > 1 else ""
    if kind == RANK.value:
        r = dict(zip(RANK_FIELDS, got[3:]))
        raise DeviceCheckError(f"iris debug: a rank outside [0, world): from_rank {r['from_rank']}, to_rank "
                               f"{r['to_rank']}, world {r['world']} (rank {rank}, in iris.{name}){more}. The access "
                               "was refused (a load read `other`, or 0; nothing was written); pass ranks in [0, world)")
    w = dict(zip(WAIT_FIELDS, got[3:]))
    flag = where(w["address"]) if where is not None else None
    flag = flag or f"the flag at address {w['address']:#x}"
    peer = f", which rank {w['peer']} should have set" if w["peer"] >= 0 else ""
    cmp = CMPS[w["cmp"]] if 0 <= w["cmp"] < len(CMPS) else "?"
    limit = "Config.spin_limit or IRIS_SPIN_LIMIT" if what == CCL_LOCK.value else \
        f"IRIS_SPIN_LIMIT={spin}, read when the context was made"
    raise WaitTimeout(f"rank {rank}: {'iris.' * (what <= WAIT_FN.value)}{name} gave up waiting for {flag} on rank "
                      f"{w['flag_rank']}{peer}: it waited for a value {cmp} {w['value']} and last read {w['seen']} "
                      f"within the spin limit ({limit}; 0 waits for ever){more}. The peer did not make the matching "
                      "call, made it in another order, or is stuck; what this kernel computed after the wait is "
                      "wrong.")
