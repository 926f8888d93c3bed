"""Run under any launcher, ranks told they are on different hosts: the group knows who shares a host,
exchanges objects across hosts, and the one-host allocators refuse the job, naming hosts and fix."""
import os
import sys

import iris
from iris.distributed import connect
from iris.errors import SpansHostsError

if sys.argv[1:] == ["split"]:  # iris.run starts every rank on one host: give each half its own name
    rank, world = int(os.environ["IRIS_RANK"]), int(os.environ["IRIS_WORLD_SIZE"])
    os.environ["IRIS_HOSTNAME"] = f"node{rank * 2 // world}"
group = connect(60)
r, w, hosts = group.rank, group.world, group.hosts
got = group.allgather((r, os.environ["IRIS_HOSTNAME"]))
assert got == [(q, hosts[q]) for q in range(w)], got
assert len(set(hosts)) == 2, hosts
assert group.local_ranks == [q for q in range(w) if hosts[q] == hosts[r]], (group.local_ranks, hosts)
if group.tcp:
    try:
        group.exchange(None, [0], "fds")
        raise AssertionError("fds crossed a group over TCP")
    except SpansHostsError:
        pass
group.barrier()
group.close()
for allocator in ("torch", "vmem"):
    try:
        iris.iris(heap_size=1 << 20, allocator=allocator, timeout=60)
        raise AssertionError(f"allocator={allocator} accepted a job on hosts {hosts}")
    except SpansHostsError as e:
        message = str(e)
        for h in sorted(set(hosts)):
            ranks = [q for q in range(w) if hosts[q] == h]
            assert f"{h}: ranks {ranks[0]}" in message, message
        assert f"allocator={allocator!r}" in message and "allocator='nvshmem'" in message, message
print(f"rank {r} of {w}: ok, {'tcp' if group.tcp else 'unix'}, local ranks {group.local_ranks}, refused: {message}",
      flush=True)
