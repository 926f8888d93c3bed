"""The offset policy on its own: thousands of random requests against a reference model, no driver."""
import random

import pytest

from iris.allocators.offsets import Offsets
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
