"""The Triton kernels of ctx.ccl, one module per algorithm: pull (stage, one flag exchange, read the
peers; or, for large all_gathers and all_to_alls, stage in segments, each signalled and read while the
next is staged), shots (two-shot all_reduce), push (by remote stores: all_reduce and all_gather), accumulate
(atomic and spinlock all_reduce), ring (all_reduce, all_gather, reduce_scatter around the ring),
tiles (reduce_scatter in Iris's tile layout), group, group_push, group_accumulate and group_ring (the
variants over a subset group: they read the members' inp in place, store into their out, or pass
pieces around the ring through iris's reserve), pair (rooted collectives, point to point, the group barrier, the mailbox), put (every collective as puts,
for jobs with indirect peers); common holds the pieces they share.

Synchronisation never leaves the device. Each program p of a launch owns a row of flags on every
rank and an epoch counter in this rank's memory; it increments its counter (so CUDA graph replays
advance it too; every warp reads it before one thread stores it back, or a late warp would run the
next call's epoch), writes the new epoch into row p, slot `rank`, of every peer's flags with release at
sys scope, and spins with acquire until its own row holds that epoch from every peer (the pipelined
forms own a row per segment: signalled once the segment is stored into the peers, waited for before
it is read). Flags only
grow (the rings' 0/1 hand-overs return to 0 by themselves), so nothing is ever reset. Program p of
one rank waits only for program p of the others (every rank splits the work the same way), never for
a program of its own launch, so the Triton interpreter, which runs programs one after another, works
too. Interpreter atomics are not atomic across processes, so under it the accumulating kernels take
turns (TURNS); on a GPU they race for real.
"""
