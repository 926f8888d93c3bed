"""iris/heap/factories.py and the allocator registry: Iris's factories keep torch's signatures while
the heap's Factories does the work; the pure size and layout helpers; allocators found by name and
warning of their own rounding. One rank on the host driver."""
import inspect
import warnings

import pytest
import torch

import iris
from iris.allocators import ALLOCATORS, allocator_named, check_heap_size
from iris.heap.factories import Factories, out_as, restride, shape_of

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

def test_out_as_and_restride():
    out = torch.arange(6.0)
    assert out_as(None, torch.Size((2, 3))) is None
    viewed = out_as(out, torch.Size((2, 3)))
    assert viewed.shape == (2, 3) and viewed.data_ptr() == out.data_ptr() and viewed[1, 2] == 5
    with pytest.raises(ValueError, match="out has 6 elements but size \\(4,\\) needs 4"):
        out_as(out, torch.Size((4,)))
    t = torch.arange(2 * 3 * 4 * 5.0).reshape(2, 3, 4, 5)
    last = restride(t, torch.channels_last)
    assert last.stride() == torch.empty(2, 3, 4, 5, memory_format=torch.channels_last).stride()
    assert last.data_ptr() == t.data_ptr()
    like = torch.empty(5, 4).t()
    kept = restride(torch.arange(20.0).reshape(4, 5), torch.preserve_format, like)
    assert kept.stride() == like.stride()
    assert restride(t) is t and restride(t, torch.preserve_format) is t


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
        for call in (lambda: ctx.zeros(3, 3, out=out), lambda: ctx.rand(3, 3, out=out),
                     lambda: ctx.linspace(0.0, 1.0, 5, out=out), lambda: ctx.randint(0, 10, (3, 3), out=out)):
            with pytest.raises(FactoryArgumentError, match="out has 4 elements but size .* cannot be resized in place"):
                call()
        with pytest.raises(RuntimeError, match="dtype torch.int32"):
            ctx.zeros(4, dtype=torch.int32, out=out)
        with pytest.raises(RuntimeError, match="a non-heap tensor"):
            ctx.zeros(4, out=torch.full((4,), 7.0))
        assert torch.equal(out, torch.full((4,), 7.0)), "a refused out= was written"
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


def test_iris_host_logging_paths():
    """Iris's module paths for the logger: iris.host.logging and iris.host.logging.logging."""
    from iris.host.logging import DEBUG, logger, set_logger_level
    from iris.host.logging import logging as host_logging
    assert logger is iris.logger and host_logging.logger is iris.logger and DEBUG == iris.DEBUG
    before = iris.logger.level
    try:
        set_logger_level(DEBUG)
        assert iris.logger.level == DEBUG
        host_logging.set_logger_level(iris.ERROR)
        assert iris.logger.level == iris.ERROR
    finally:
        iris.logger.setLevel(before)
