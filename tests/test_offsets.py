"""The offset policy on its own: thousands of random requests against a reference model, no driver."""
import random

import pytest

from iris.allocators.offsets import CachingOffsets, Offsets
from iris.allocators.sorted_ints import SortedInts


class Reference:
    """The policy written the slow, obvious way: a list of free blocks in address order, scanned."""

    def __init__(self, capacity):
        self.free, self.live = [[0, capacity]], {}

    def allocate(self, size, align, top=False):
        fits = []
        for i, (start, length) in enumerate(self.free):
            at = (start + length - size) // align * align if top else -(-start // align) * align
            if start <= at and at + size <= start + length:
                fits.append((-start if top else length, start, i, at))
        if not fits:
            return None
        _, start, i, at = min(fits)
        length = self.free[i][1]
        self.free[i:i + 1] = [b for b in ([start, at - start], [at + size, start + length - at - size]) if b[1]]
        self.live[at] = size
        return at

    def free_(self, offset):
        size = self.live.pop(offset)
        self.free.append([offset, size])
        self.free.sort()
        merged = []
        for start, length in self.free:
            if merged and merged[-1][0] + merged[-1][1] == start:
                merged[-1][1] += length
            else:
                merged.append([start, length])
        self.free = merged
        return size


class CachingReference(Reference):
    """The caching layer the obvious way: freed blocks listed by size; a request of a cached size
    takes the lowest one, any other request (or a top one) first frees every cached block."""

    def __init__(self, capacity):
        super().__init__(capacity)
        self.cache = []  # (size, offset) of freed, uncoalesced blocks

    def allocate(self, size, align, top=False):
        mine = sorted(o for s, o in self.cache if s == size)
        if mine and not top and mine[0] % align == 0:
            self.cache.remove((size, mine[0]))
            self.live[mine[0]] = size
            return mine[0]
        self.flush()
        return super().allocate(size, align, top)

    def free_(self, offset):
        size = self.live.pop(offset)
        self.cache.append((size, offset))
        return size

    def flush(self):
        for size, offset in self.cache:
            self.live[offset] = size
            super().free_(offset)
        self.cache = []


def _check_accounting(policy, capacity):
    """No two blocks overlap, and live plus free blocks tile [0, capacity) exactly."""
    spans = sorted(list(policy.live.items()) + policy.free_blocks())
    at = 0
    for start, size in spans:
        assert start == at, f"gap or overlap at {at}: next block starts at {start}"
        at = start + size
    assert at == capacity
    assert policy.free_bytes == sum(s for _, s in policy.free_blocks())


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_random_sequences_match_the_reference(seed):
    capacity = 1 << 26
    rng, policy, ref, trace = random.Random(seed), Offsets(capacity), Reference(capacity), []
    for step in range(4000):
        if policy.live and rng.random() < 0.45:
            off = rng.choice(list(policy.live))
            assert policy.free(off) == ref.free_(off)
            trace.append(("free", off))
        else:
            size = rng.choice([rng.randint(1, 300), rng.randint(1, 1 << 16), 256 * rng.randint(1, 64)])
            align, top = 1 << rng.randint(0, 12), rng.random() < 0.03
            got = policy.allocate(size, align, top)
            assert got == ref.allocate(size, align, top), f"step {step}: allocate({size}, {align}, top={top})"
            assert got is None or got % align == 0
            trace.append(("alloc", size, got))
        if step % 97 == 0:
            assert policy.free_blocks() == [tuple(b) for b in ref.free], "free blocks differ: coalescing"
            _check_accounting(policy, capacity)
    _check_accounting(policy, capacity)
    for off in list(policy.live):
        policy.free(off)
    assert policy.free_blocks() == [(0, capacity)], "frees did not coalesce back to one block"


def test_same_calls_same_offsets():
    def run():
        rng, p, out = random.Random(11), Offsets(1 << 30), []
        for _ in range(3000):
            if p.live and rng.random() < 0.5:
                p.free(rng.choice(sorted(p.live)))
            else:
                out.append(p.allocate(rng.randint(1, 1 << 20), 256))
        return out
    assert run() == run()


def test_sorted_ints_against_a_sorted_list():
    rng, s, ref = random.Random(5), SortedInts(), []
    for _ in range(6000):  # enough to split buckets of 2 * LOAD
        x = rng.randint(0, 3000)
        if x in ref and rng.random() < 0.4:
            s.remove(x)
            ref.remove(x)
        elif x not in ref:
            s.add(x)
            ref.append(x)
            ref.sort()
        q = rng.randint(-5, 3005)
        assert s.ceil(q) == next((v for v in ref if v >= q), None)
        assert s.floor(q) == next((v for v in reversed(ref) if v <= q), None)
    assert list(s) == ref and len(s) == len(ref) and list(s.descending()) == ref[::-1]
    assert list(s.irange(1500)) == [v for v in ref if v >= 1500]
    with pytest.raises(KeyError):
        s.remove(-1)


def test_reuse_best_fit_and_errors():
    p = Offsets(1000)
    a, b, c = p.allocate(100), p.allocate(100), p.allocate(100)
    assert (a, b, c) == (0, 100, 200)
    p.free(b)
    assert p.allocate(50) == 100 and p.allocate(60) == 300  # the 100-byte hole, then the rest
    p.free(a)
    assert p.allocate(40) == 150  # best fit: the 50-byte hole beats the 100-byte one below it
    assert p.allocate(10_000) is None
    with pytest.raises(ValueError, match="not the start"):
        p.free(5)
    with pytest.raises(ValueError, match="power of two"):
        p.allocate(10, 3)
    with pytest.raises(ValueError):
        p.allocate(0)


@pytest.mark.parametrize("seed", [4, 5, 6])
def test_caching_layer_matches_its_reference(seed):
    """Sizes repeat in phases (as a program's loops do), so many requests hit the cache and some miss
    and flush it; every byte stays accounted for, no two blocks overlap, and a flush coalesces back
    to what the plain policy holds."""
    capacity = 1 << 24
    rng, policy, ref = random.Random(seed), CachingOffsets(capacity), CachingReference(capacity)
    sizes = [256 * rng.randint(1, 64) for _ in range(12)]
    hits = 0
    for step in range(5000):
        if policy.live and rng.random() < 0.48:
            off = rng.choice(list(policy.live))
            assert policy.free(off) == ref.free_(off)
        else:
            size = sizes[step // 50 % len(sizes)] if rng.random() < 0.9 else rng.randint(1, 1 << 15)
            align, top = 1 << rng.randint(0, 9), rng.random() < 0.02
            hits += any(s == size for s, _ in ref.cache) and not top
            got = policy.allocate(size, align, top)
            assert got == ref.allocate(size, align, top), f"step {step}: allocate({size}, {align}, top={top})"
            assert got is None or got % align == 0
        if step % 89 == 0:
            assert policy.free_bytes == capacity - sum(policy.live.values())
            ref.flush()  # free_blocks flushes the policy's cache: the reference does the same
            assert policy.free_blocks() == [tuple(b) for b in ref.free], "free blocks differ after a flush"
            _check_accounting(policy, capacity)
    assert hits > 200, f"only {hits} requests could take a cached block: the test does not exercise the cache"
    for off in list(policy.live):
        policy.free(off)
    assert policy.free_blocks() == [(0, capacity)], "cached blocks did not coalesce back to one block"


def test_caching_layer_reuses_the_lowest_block_and_flushes_on_a_miss():
    p = CachingOffsets(1 << 20)
    a, b, c, d = (p.allocate(4096, 256) for _ in range(4))
    p.free(c), p.free(a)
    assert p.allocate(4096, 256) == a, "the lowest cached block of the size comes first"
    assert p.allocate(4096, 1 << 13) == 1 << 13 == c, "an aligned cached block serves a larger alignment"
    p.free(b), p.free(c)
    assert p.allocate(8192, 256) == b, "a miss coalesces the cached b and c into one 8 KiB block first"
    assert p.largest_free() == p.free_bytes == (1 << 20) - 4 * 4096
    with pytest.raises(ValueError, match="not the start"):
        p.free(b + 256)
    with pytest.raises(ValueError, match="not the start"):
        p.free(c)  # freed already: now part of b's block
