"""iris/heap/factories.py and the allocator registry: Iris's factories keep torch's signatures while
the heap's Factories does the work; the pure size and layout helpers; allocators found by name and
warning of their own rounding. One rank on the host driver."""
import inspect
import re
import warnings

import pytest
import torch

import iris
from iris.allocators import ALLOCATORS, allocator_named, check_heap_size
from iris.heap.factories import Factories, shape_of, strides_for

FACTORIES = ["empty", "zeros", "ones", "full", "empty_like", "zeros_like", "ones_like", "full_like", "arange",
             "linspace", "rand", "randn", "uniform", "randint"]


@pytest.mark.parametrize("name", FACTORIES)
def test_iris_factory_has_the_heap_factory_signature(name):
    """ctx.<name> delegates to heap.factories.<name>: the same parameters, kinds and defaults."""
    ours = inspect.signature(getattr(iris.Iris, name)).parameters
    heaps = inspect.signature(getattr(Factories, name)).parameters
    assert [(p.name, p.kind, p.default) for p in ours.values()] == \
           [(p.name, p.kind, p.default) for p in heaps.values()]


def test_shape_of_follows_torch():
    assert shape_of((2, 3)) == torch.Size((2, 3))
    assert shape_of(((2, 3),)) == shape_of(([2, 3],)) == shape_of((torch.Size((2, 3)),)) == torch.Size((2, 3))
    assert shape_of((((4,),),)) == torch.Size((4,))
    with pytest.raises(TypeError, match="sizes must be ints, got float"):
        shape_of((2.0,))
    with pytest.raises(TypeError, match="got bool"):
        shape_of((True,))
    with pytest.raises(ValueError, match="negative dimension -1"):
        shape_of((3, -1))
    with pytest.raises(ValueError, match="does not fit in 64 bits"):
        shape_of((1 << 63,))



def test_usual_requests_take_the_short_path():
    """The usual factory call, with or without a dtype, is answered by plain_request once its dtype
    was checked once (the default dtype included): the checked path runs on every call otherwise."""
    from iris.validate import dtype_of, plain_request
    for dtype in (None, torch.float16, torch.int32):
        dtype_of(dtype)
        assert plain_request((3, 4), dtype) == ((3, 4), dtype or torch.get_default_dtype(),
                                                12 * (dtype or torch.get_default_dtype()).itemsize)
        assert plain_request(5, dtype)[2] == 5 * (dtype or torch.get_default_dtype()).itemsize
    assert plain_request((3, 4.0), None) is None  # not ints: the checked path says why
    assert plain_request((3, -1), None) is None

def test_strides_for_every_memory_format_are_torchs():
    """A new tensor in each memory format gets torch's strides (channels_last_3d of (2, 3, 4, 5, 6) is
    (360, 1, 90, 18, 3), where Iris gives (360, 1, 72, 18, 3), whose rows overlap); preserve_format
    keeps a dense input's layout, as torch does, and lays a non-dense one out as torch does."""
    shapes = [(2, 3, 4, 5), (2, 3, 4, 5, 6), (1, 3, 1, 5), (3, 1, 4, 1, 2), (4, 6), (5,), ()]
    for shape in shapes:
        for fmt in (torch.contiguous_format, torch.channels_last, torch.channels_last_3d):
            if fmt in (torch.channels_last, torch.channels_last_3d) and len(shape) != (4 if fmt is torch.channels_last
                                                                                         else 5):
                continue
            got = strides_for(torch.Size(shape), fmt)
            assert (got or torch.empty(shape).stride()) == torch.empty(shape, memory_format=fmt).stride(), (shape, fmt)
    assert strides_for(torch.Size((2, 3, 4, 5, 6)), torch.channels_last_3d) == (360, 1, 90, 18, 3)
    likes = [torch.empty(2, 3, 4, 5).to(memory_format=torch.channels_last),
             torch.empty(2, 3, 4, 5, 6).to(memory_format=torch.channels_last_3d), torch.empty(5, 4).t(),
             torch.empty(4, 6, 8).permute(2, 0, 1), torch.empty(6, 8)[:, ::2], torch.empty(3, 4)]
    for like in likes:
        for fmt in (torch.preserve_format, torch.contiguous_format):
            want = torch.empty_like(like, memory_format=fmt).stride()
            assert (strides_for(like.shape, fmt, like) or torch.empty(like.shape).stride()) == want, (like.stride(), fmt)
    assert strides_for(torch.Size((3, 4))) is None and strides_for(torch.Size((3, 4)), torch.preserve_format) is None


def test_heap_factories_fill_every_element():
    """The heap's Factories alone (what ctx's factories call), checked element by element over
    memory poisoned first: a block reused from a freed, poisoned tensor."""
    with iris.iris(heap_size=1 << 22) as ctx:
        f = ctx.heap.factories
        for fill, make in ((0.0, lambda: f.zeros(3, 5)), (1.0, lambda: f.ones((3, 5))),
                           (-2.5, lambda: f.full((3, 5), -2.5)), (7.0, lambda: f.full_like(torch.empty(3, 5), 7.0))):
            poison = f.empty(3, 5)
            poison.fill_(12345.0)
            ctx.free(poison)
            t = make()
            assert ctx.is_symmetric(t) and t.dtype == torch.float32
            assert torch.equal(t, torch.full((3, 5), fill)), (fill, t)
            ctx.free(t)
        r = f.arange(2, 11, 3)
        assert torch.equal(r, torch.tensor([2, 5, 8])) and ctx.is_symmetric(r)
        g = f.randint(3, 9, (1000,), generator=torch.Generator().manual_seed(1))
        assert g.min() >= 3 and g.max() < 9 and len(set(g.tolist())) == 6
        with pytest.raises(ValueError, match="the heap lives on cpu"):
            f.zeros(2, device="meta")


def test_allocators_by_name_and_heap_size():
    assert {name: cls.name for name, cls in ALLOCATORS.items()} == {n: n for n in ALLOCATORS}
    assert allocator_named("vmem_chunked") == "vmem" and allocator_named("torch") == "torch"
    with pytest.raises(ValueError, match="unknown allocator 'cuda'; use one of"):
        allocator_named("cuda")
    assert check_heap_size(4096) == 4096
    with pytest.raises(TypeError, match="heap_size must be an int"):
        check_heap_size(1.5)
    with pytest.raises(ValueError, match="heap_size must be positive, got 0"):
        check_heap_size(0)


def test_vmem_warns_of_its_own_rounding():
    """The allocator, not the context, says that the user's part (heap_size less reserved) was rounded."""
    from iris.platform.host import HostDriver
    driver, reserved = HostDriver(), 8192
    probe = ALLOCATORS["vmem"](driver, 1 << 21)
    chunk = probe.chunk
    probe.close()
    with pytest.warns(UserWarning, match=f"heap_size={chunk + 1} is not a multiple of the {chunk}-byte chunk of the "
                                         f"vmem allocator: rounded up; the heap holds {2 * chunk - reserved} bytes"):
        a = ALLOCATORS["vmem"](driver, chunk + 1 + reserved, reserved=reserved)
    assert a.size == 2 * chunk and a.capacity == 2 * chunk - reserved
    a.close()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ALLOCATORS["vmem"](driver, chunk + reserved, reserved=reserved).close()  # the user's part is whole


def test_factories_take_and_refuse_what_iris_does():
    """Iris's tests/unittests: a device that is not the heap's, an out= of another size or dtype or off
    the heap, and an empty randint range raise RuntimeError (iris's FactoryArgumentError is also a
    ValueError), before anything is written; linspace takes steps in a tuple; randint takes (high,
    size), (low, high, size) and nested sizes, and refuses other argument counts with ValueError."""
    from iris.errors import FactoryArgumentError
    with iris.iris(heap_size=1 << 22) as ctx:
        for device in ("cpu:1", "cuda", "meta"):
            with pytest.raises(RuntimeError, match="the heap lives on cpu"):
                ctx.zeros(3, 3, device=device)
        assert torch.equal(ctx.zeros(2, device="cpu:0"), torch.zeros(2))
        out = ctx.full((4,), 7.0)
        made = ctx.heap.stats["allocations"]
        for call in (lambda: ctx.zeros(3, 3, out=out), lambda: ctx.rand(3, 3, out=out),
                     lambda: ctx.linspace(0.0, 1.0, 5, out=out), lambda: ctx.randint(0, 10, (3, 3), out=out)):
            with pytest.raises(FactoryArgumentError, match="The output tensor has 4 elements, but (9|5) are required "
                                                           "for size .*: a heap tensor cannot be resized in place"):
                call()
        # Iris's regexes (tests/unittests/test_zeros.py), in Iris's order: elements, dtype, heap
        with pytest.raises(RuntimeError, match="The output tensor has dtype torch.float32, but torch.int32 is required"):
            ctx.zeros(4, dtype=torch.int32, out=out)
        with pytest.raises(RuntimeError, match="The output tensor has 4 elements, but 9 are required"):
            ctx.zeros(3, 3, dtype=torch.int32, out=torch.full((4,), 7.0))
        with pytest.raises(RuntimeError, match="The output tensor is not on the symmetric heap"):
            ctx.zeros(4, out=torch.full((4,), 7.0))
        assert torch.equal(out, torch.full((4,), 7.0)), "a refused out= was written"
        assert ctx.heap.stats["allocations"] == made, "a refused call allocated"
        for steps in (5, (5,), [5], ((5,),)):
            got = ctx.linspace(-1.0, 3.0, steps)
            assert ctx.is_symmetric(got) and torch.equal(got, torch.linspace(-1.0, 3.0, 5)), (steps, got)
        gen = torch.Generator().manual_seed(3)
        for args, shape, lo, hi in (((10, (2, 3)), (2, 3), 0, 10), ((-10, -5, (100,)), (100,), -10, -5),
                                    ((0, 10, ((2, 3, 4),)), (2, 3, 4), 0, 10), ((4, 9, [2, 5]), (2, 5), 4, 9),
                                    ((0, 10, ()), (), 0, 10)):
            r = ctx.randint(*args, generator=gen)
            assert r.shape == shape and r.dtype == torch.int64 and ctx.is_symmetric(r)
            assert bool((r >= lo).all()) and bool((r < hi).all()), (args, r)
        assert len(set(ctx.randint(3, 9, (500,), generator=gen).tolist())) == 6
        f = ctx.randint(0, 10, (2, 2), dtype=torch.float32, requires_grad=True)
        assert f.requires_grad and f.dtype == torch.float32 and bool((f == f.floor()).all())
        for bad in ((10,), (0, 10, (2, 3), (4, 5))):
            with pytest.raises(ValueError, match="randint takes \\(high, size\\) or \\(low, high, size\\)"):
                ctx.randint(*bad)
        with pytest.raises(RuntimeError, match="randint needs low < high, got low=10 high=5"):
            ctx.randint(10, 5, (2, 3))


def test_memory_formats_lay_out_as_torch():
    """empty(memory_format=) and the *_like factories give torch's strides for every format, over
    distinct elements (every element of the block once); channels_last asked of a tensor that is not
    4-d (channels_last_3d, 5-d) warns and lays it out contiguously, as Iris does, where torch raises."""
    with iris.iris(heap_size=1 << 22) as ctx:
        def distinct(t):
            with torch.no_grad():
                t.copy_(torch.arange(t.numel(), dtype=torch.float32).reshape(t.shape))
            block = torch.as_strided(t, (t.numel(),), (1,))  # the numel elements from t's first on
            return sorted(block.tolist()) == list(range(t.numel()))

        for shape, fmt in (((2, 3, 4, 5), torch.channels_last), ((2, 3, 4, 5, 6), torch.channels_last_3d),
                           ((2, 3, 4, 5), torch.contiguous_format)):
            want = torch.empty(shape, memory_format=fmt).stride()
            t = ctx.empty(*shape, memory_format=fmt)
            assert t.stride() == want and distinct(t), (shape, fmt, t.stride())
            like = ctx.full(shape, 1.0)
            for make in (ctx.empty_like, ctx.zeros_like, ctx.ones_like, lambda x, **k: ctx.full_like(x, 3.0, **k)):
                t = make(like, memory_format=fmt)
                assert t.stride() == want and t.shape == like.shape and distinct(t), (make, shape, fmt, t.stride())
        assert ctx.zeros_like(ctx.empty(2, 3, 4, 5, 6, memory_format=torch.channels_last_3d)).stride() == \
            (360, 1, 90, 18, 3)
        for like in (torch.empty(5, 4).t(), torch.empty(4, 6, 8).permute(2, 0, 1), torch.empty(6, 8)[:, ::2]):
            t = ctx.zeros_like(like)
            assert t.stride() == torch.zeros_like(like).stride() and distinct(t), (like.stride(), t.stride())

        for call, size in ((lambda: ctx.empty(3, 3, memory_format=torch.channels_last), (3, 3)),
                           (lambda: ctx.empty(2, 3, 4, 5, memory_format=torch.channels_last_3d), (2, 3, 4, 5)),
                           (lambda: ctx.zeros_like(ctx.ones(6), memory_format=torch.channels_last), (6,))):
            with pytest.warns(UserWarning, match=f"lays out [45]-d tensors; size {re.escape(str(size))} is "):
                t = call()
            assert t.shape == size and t.is_contiguous() and ctx.is_symmetric(t), (size, t.stride())


@pytest.mark.parametrize("name", ["empty", "zeros", "ones", "full", "zeros_like", "rand", "randint", "randn",
                                  "linspace"])
def test_factories_refuse_a_device_not_the_heaps(name):
    """Iris's tests/unittests/test_<name>.py pass device="cpu", never the heap's there, and expect a
    RuntimeError; on the host the heap lives on cpu, so "cpu" is the heap's own device and is taken.
    A device that is not the heap's is refused before anything is allocated."""
    calls = {"empty": lambda c, d: c.empty(3, 3, device=d), "zeros": lambda c, d: c.zeros(3, 3, device=d),
             "ones": lambda c, d: c.ones(3, 3, device=d), "full": lambda c, d: c.full((3, 3), 2.5, device=d),
             "zeros_like": lambda c, d: c.zeros_like(c.ones(3, 3), device=d),
             "rand": lambda c, d: c.rand(3, 3, device=d), "randint": lambda c, d: c.randint(0, 10, (3, 3), device=d),
             "randn": lambda c, d: c.randn(3, 3, device=d), "linspace": lambda c, d: c.linspace(0.0, 1.0, 5, device=d)}
    from iris.errors import FactoryArgumentError
    with iris.iris(heap_size=1 << 22) as ctx:
        heap = ctx.get_device()
        others = ["meta", "cpu" if heap.type == "cuda" else "cuda", f"{heap.type}:{(heap.index or 0) + 1}"]
        assert ctx.is_symmetric(calls[name](ctx, heap.type)) and ctx.is_symmetric(calls[name](ctx, str(heap)))
        for device in others:
            like = ctx.ones(3, 3)
            made = ctx.heap.stats["allocations"]
            with pytest.raises(FactoryArgumentError, match=f"the heap lives on {heap}; got device='{device}'") as e:
                calls[name](ctx, device) if name != "zeros_like" else ctx.zeros_like(like, device=device)
            assert isinstance(e.value, RuntimeError) and ctx.heap.stats["allocations"] == made, (name, device)
