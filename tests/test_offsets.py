"""The offset policy on its own: thousands of random requests, no driver."""
import random

import pytest

from iris.allocators.offsets import Offsets


def _check_disjoint(live, capacity):
    spans = sorted(live.items())
    for (a, sa), (b, _) in zip(spans, spans[1:]):
        assert a + sa <= b, f"blocks at {a}(+{sa}) and {b} overlap"
    assert not spans or spans[-1][0] + spans[-1][1] <= capacity


def test_random_allocate_free_is_disjoint_deterministic_and_coalesces():
    def run(seed):
        rng, policy, trace = random.Random(seed), Offsets(1 << 24), []
        for _ in range(10_000):
            if policy.live and rng.random() < 0.45:
                off = rng.choice(sorted(policy.live))
                trace.append(("free", off, policy.free(off)))
            else:
                size, align = rng.randint(1, 1 << 16), 1 << rng.randint(0, 12)
                off = policy.allocate(size, align)
                trace.append(("alloc", size, off))
                if off is not None:
                    assert off % align == 0
            _check_disjoint(policy.live, policy.capacity)
        assert policy.free_bytes + sum(policy.live.values()) == policy.capacity
        for off in sorted(policy.live):
            policy.free(off)
        assert policy.free_blocks() == [(0, 1 << 24)], "frees did not coalesce back to one block"
        return trace

    assert run(7) == run(7), "the same calls must give the same offsets"


def test_reuse_lowest_fit_and_errors():
    p = Offsets(1000)
    a, b, c = p.allocate(100), p.allocate(100), p.allocate(100)
    assert (a, b, c) == (0, 100, 200)
    p.free(b)
    assert p.allocate(50) == 100 and p.allocate(60) == 300
    assert p.allocate(10_000) is None
    with pytest.raises(ValueError, match="not the start"):
        p.free(5)
    with pytest.raises(ValueError, match="power of two"):
        p.allocate(10, 3)
    with pytest.raises(ValueError):
        p.allocate(0)
