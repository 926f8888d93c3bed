"""allocate_symmetric and address maps on every provider: iris's own heap (torch, vmem and nvshmem
allocators), NvshmemProvider and TorchSymmMemProvider. One kernel serves them all: it reads a
peer's copy of one allocation and writes the peer's copy of another, translating through each
allocation's own table by hand, or through iris.load/iris.store given the table as heap_bases.

On the host the iris heap runs in the Triton interpreter; NVSHMEM and torch symmetric memory need
a GPU (marker gpu). Several ranks share one GPU there: NVSHMEM allows it (put, get, atomics,
barrier_all); torch's CUDA backend refuses it at rendezvous, and the test skips saying so.
"""
import os
import subprocess
import sys
import traceback

import pytest
import torch
import triton
import triton.language as tl

import iris
from iris.errors import AddressMapError, ProviderUnavailable
from iris.experimental.symmetric_memory import SymmetricAddressMap, address_map

CAP, N, POISON = 96, 80, -7.0


# -- the address map alone ---------------------------------------------------------------------
def test_map_keeps_the_table_and_says_which_peers_are_direct():
    m = address_map([0x1000, 0, 0x3000], 2, 3, 0x3000, 64, "cpu")
    assert isinstance(m, SymmetricAddressMap)
    assert m.peer_bases.tolist() == [0x1000, 0, 0x3000] and m.peer_bases.dtype == torch.int64
    assert (m.local_rank, m.allocation_base, m.allocation_bytes) == (2, 0x3000, 64)
    assert m.direct == (True, False, True) and not m.all_direct() and m.indirect_peers() == [1]
    with pytest.raises(AddressMapError, match=r"ranks \[1\] are not reachable by load and store"):
        m.direct_table()
    ok = address_map([0x1000, 0x2000], 0, 2, 0x1000, 8, "cpu")
    assert ok.all_direct() and ok.direct_table() is ok.peer_bases


@pytest.mark.parametrize("bases, rank, base, direct, message", [
    ([0x1000], 0, 0x1000, None, "has 1 entries for a job of 2 ranks"),
    ([0x1000, 0x2000, 0x3000], 0, 0x1000, None, "has 3 entries for a job of 2 ranks"),
    ([0x1000, 0x2000], 1, 0x2100, None, r"peer_bases\[1\] = 0x2000 is not this allocation's base 0x2100"),
    ([0x1000, 0], 0, 0x1000, (True, True), r"ranks \[1\] are marked direct but their peer_bases entry is 0"),
    ([0x1000, 0x2000], 2, 0x1000, None, r"local rank 2 is not in \[0, 2\)"),
])
def test_bad_tables_raise_before_a_kernel_sees_them(bases, rank, base, direct, message):
    with pytest.raises(AddressMapError, match=message):
        address_map(bases, rank, 2, base, 64, "cpu", direct)


def test_import_iris_loads_no_provider_package():
    code = ("import sys, iris, iris.experimental.symmetric_memory; "
            "bad = [m for m in sys.modules if m.split('.')[0] == 'nvshmem' or m.startswith('cuda.core') "
            "or m.startswith('torch.distributed._symmetric_memory')]; print(bad); sys.exit(1 if bad else 0)")
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr


def test_missing_nvshmem_names_the_extra():
    try:
        import nvshmem.core  # noqa: F401
        pytest.skip("nvshmem4py is installed here: the message for its absence cannot be shown")
    except ImportError:
        pass
    from iris.experimental import nvshmem_runtime
    with pytest.raises(ProviderUnavailable, match=r"pip install 'iris-shmem\[nvshmem\]'"):
        nvshmem_runtime.load()


# -- one kernel for every provider ---------------------------------------------------------------
@triton.jit
def _read_double_write(a, b, a_bases, b_bases, me, peer, n, THROUGH_IRIS: tl.constexpr, BLOCK: tl.constexpr):
    """peer's b[i] = peer's a[i] * 2 + me, for i < n: a and b are this rank's pointers."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = o < n
    if THROUGH_IRIS:
        v = iris.load(a + o, me, peer, a_bases, mask=m)
        iris.store(b + o, v * 2 + me, me, peer, b_bases, mask=m)
    else:  # peer_bases[peer] + (ptr - peer_bases[me]), in elements of 4 bytes
        src = a + (tl.load(a_bases + peer) - tl.load(a_bases + me)) // 4
        dst = b + (tl.load(b_bases + peer) - tl.load(b_bases + me)) // 4
        tl.store(dst + o, tl.load(src + o, mask=m) * 2 + me, mask=m)


def check_provider(p, free, through_iris: bool) -> list:
    """Allocate, translate, views, foreign tensors, free: failures as strings."""
    me, world = p.get_rank(), p.get_num_ranks()
    peer, writer = (me + 1) % world, (me - 1) % world
    fails = []
    a, amap = p.allocate_symmetric_map(CAP, dtype=torch.float32)
    b, b_bases = p.allocate_symmetric(CAP, dtype=torch.float32)
    if amap.peer_bases[me].item() != a.data_ptr() or b_bases[me].item() != b.data_ptr():
        fails.append(f"rank {me}: own entries {amap.peer_bases.tolist()} {b_bases.tolist()} are not the bases")
    if not amap.all_direct() or amap.allocation_bytes != CAP * 4 or len(amap.direct) != world:
        fails.append(f"rank {me}: map {amap}")
    a.copy_(torch.arange(CAP, dtype=torch.float32) + 1000 * me)
    b.fill_(POISON)
    p.barrier()
    view = a[8:]  # a view translates against its allocation: its table is the allocation's
    vmap = p.symmetric_address_map(view)
    if vmap.allocation_base != a.data_ptr() or vmap.peer_bases.tolist() != amap.peer_bases.tolist():
        fails.append(f"rank {me}: the view's map {vmap} is not the allocation's {amap}")
    _read_double_write[(triton.cdiv(N - 8, 32),)](view, b[8:], vmap.peer_bases, b_bases, me, peer, N - 8,
                                                  THROUGH_IRIS=through_iris, BLOCK=32)
    p.barrier()
    want = torch.full((CAP,), POISON)
    want[8:N] = (torch.arange(8, N, dtype=torch.float32) + 1000 * me) * 2 + writer
    got = b.cpu()
    if not torch.equal(got, want):
        bad = (got != want).nonzero().flatten().tolist()
        fails.append(f"rank {me}: b wrong at {bad[:8]} ({len(bad)} elements): {got[bad[:4]].tolist()} "
                     f"want {want[bad[:4]].tolist()}")
    for foreign in (torch.empty(CAP, device=a.device), a.clone()):
        try:
            p.symmetric_address_map(foreign)
            fails.append(f"rank {me}: a tensor it did not allocate got a map")
        except KeyError:
            pass
    p.barrier()
    free(b)
    free(a)
    try:
        p.symmetric_address_map(a)
        fails.append(f"rank {me}: a freed allocation still has a map")
    except KeyError:
        pass
    return fails


def rank_ctx(allocator, through_iris):
    ctx = iris.iris(heap_size=1 << 22, allocator=allocator)
    try:
        return check_provider(ctx, ctx.free, through_iris)
    except Exception:
        return [f"rank {ctx.get_rank()} raised:\n{traceback.format_exc()}"]
    finally:
        ctx.close()


@pytest.mark.parametrize("allocator", ["torch", "vmem"])
def test_allocate_symmetric_on_the_iris_heap(allocator):
    fails = iris.spawn(rank_ctx, 2, args=(allocator, allocator == "vmem"), timeout=300)
    assert not [f for r in fails for f in r], fails


def test_allocate_symmetric_keeps_iris_sizes_and_raises_for_indirect_peers():
    ctx = iris.iris(heap_size=1 << 20)
    try:
        t, bases = ctx.allocate_symmetric((4, 6), dtype=torch.int32)
        assert t.shape == (4, 6) and t.dtype == torch.int32 and bases.tolist() == [t.data_ptr()]
        t2, m = ctx.allocate_symmetric_map(3)
        assert t2.dtype == torch.get_default_dtype() and m.allocation_bytes == 3 * t2.element_size()
        with pytest.raises(KeyError):
            ctx.symmetric_address_map(torch.zeros(3))
    finally:
        ctx.close()


def rank_nvshmem_on_host():
    try:
        iris.iris(heap_size=1 << 20, allocator="nvshmem")
    except ProviderUnavailable as e:
        return str(e)
    return "no error"


def test_nvshmem_allocator_refuses_the_host_before_allocating():
    if torch.cuda.is_available():
        pytest.skip("a GPU is here: the GPU tests run the nvshmem allocator")
    got = iris.spawn(rank_nvshmem_on_host, 2, timeout=300)
    assert all("allocator='nvshmem' needs a CUDA GPU" in g for g in got), got


# -- GPU: NVSHMEM and torch symmetric memory, several ranks on one GPU --------------------------
def _nvshmem_or_skip():
    try:
        from iris.experimental import nvshmem_runtime
        nvshmem_runtime.load()
    except ProviderUnavailable as e:
        pytest.skip(str(e))


def rank_nvshmem_provider(through_iris):
    from iris.experimental.nvshmem_provider import NvshmemProvider
    p = NvshmemProvider()
    try:
        fails = check_provider(p, p.free, through_iris)
        if (p.cur_rank, p.num_ranks) != (p.get_rank(), p.get_num_ranks()):
            fails.append("cur_rank/num_ranks differ from get_rank/get_num_ranks")
        return fails
    except Exception:
        return [f"rank {p.get_rank()} raised:\n{traceback.format_exc()}"]


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_nvshmem_provider(world):
    _nvshmem_or_skip()
    fails = iris.spawn(rank_nvshmem_provider, world, args=(world == 4,), timeout=300)
    assert not [f for r in fails for f in r], fails


@pytest.mark.gpu
@pytest.mark.parametrize("world", [2, 4])
def test_allocate_symmetric_on_the_nvshmem_allocator(world):
    _nvshmem_or_skip()
    fails = iris.spawn(rank_ctx, world, args=("nvshmem", world == 2), timeout=300)
    assert not [f for r in fails for f in r], fails


def rank_torch_symm(port):
    import torch.distributed as dist
    from iris.experimental.torch_symm_mem_provider import TorchSymmMemProvider
    rank, world = int(os.environ["IRIS_RANK"]), int(os.environ["IRIS_WORLD_SIZE"])
    torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        p = TorchSymmMemProvider()
        try:
            return check_provider(p, p.free, True)
        except RuntimeError as e:
            if "overlapping devices" in str(e):
                return ["SKIP " + str(e).splitlines()[0]]
            raise
    except Exception:
        return [f"rank {rank} raised:\n{traceback.format_exc()}"]
    finally:
        dist.destroy_process_group()


@pytest.mark.gpu
@pytest.mark.parametrize("world", [1, 2])
def test_torch_symm_mem_provider(world):
    """One rank runs every check on a real rendezvous (its peer is itself); two need a GPU each."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    fails = [f for r in iris.spawn(rank_torch_symm, world, args=(port,), timeout=300) for f in r]
    skips = [f for f in fails if f.startswith("SKIP ")]
    if skips:
        pytest.skip(f"torch symmetric memory's CUDA backend refuses {world} ranks on "
                    f"{torch.cuda.device_count()} GPU(s) at rendezvous: {skips[0][5:]}")
    assert not fails, fails
