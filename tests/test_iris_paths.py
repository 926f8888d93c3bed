"""Iris's module paths, for programs and tests written against Iris: iris.host.logging (with Iris's
IrisFormatter), iris.mem (the device API) and iris.tensor_creation (the factory helpers over ctx.heap).
One rank on the host driver."""
import logging

import pytest
import torch

import iris
from iris.errors import FactoryArgumentError


def _record(message, rank=None):
    record = logging.LogRecord("iris", logging.INFO, "", 0, message, (), None)
    if rank is not None:
        record.iris_rank, record.iris_num_ranks = rank, 4
    return record


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


def test_iris_formatter_and_records_without_a_rank():
    """IrisFormatter (Iris's path iris.host.logging.logging) writes "[Iris] [rank/world] message", or
    "[Iris] message" without a rank; iris's own handler formats a record logged through iris.logger
    directly (no rank) instead of failing on it."""
    from iris.host.logging import IrisFormatter as same
    from iris.host.logging.logging import IrisFormatter
    assert same is IrisFormatter is iris.logging.IrisFormatter
    formatter = IrisFormatter()
    assert formatter.format(_record("no rank")) == "[Iris] no rank"
    assert formatter.format(_record("with rank", 2)) == "[Iris] [2/4] with rank"
    assert iris.logger.handlers[0].format(_record("direct")) == "[iris rank ?/?] INFO: direct"
    with iris.iris(heap_size=1 << 20) as ctx:
        seen = []
        handler = logging.Handler()
        handler.setFormatter(IrisFormatter())
        handler.emit = lambda record: seen.append(handler.format(record))
        before, iris.logger.handlers = iris.logger.handlers, [handler]
        level = iris.logger.level
        try:
            iris.set_logger_level(iris.INFO)
            ctx.info("from the context")
            iris.logger.info("from the logger")
        finally:
            iris.logger.handlers = before
            iris.logger.setLevel(level)
    assert seen == ["[Iris] [0/1] from the context", "[Iris] from the logger"], seen


def test_iris_mem_is_the_device_api():
    from iris.mem.triton import Context, DeviceContext, Tile, TileView, make_tensor_view
    from iris.mem.triton.context import Context as context
    from iris.mem.triton import ops
    assert Context is context is DeviceContext is iris.DeviceContext
    assert (Tile, TileView, make_tensor_view) == (iris.Tile, iris.TileView, iris.make_tensor_view)
    for name in ("load", "store", "get", "put", "copy", "atomic_add", "atomic_sub", "atomic_cas", "atomic_xchg",
                 "atomic_and", "atomic_or", "atomic_xor", "atomic_min", "atomic_max"):
        assert getattr(ops, name) is getattr(iris, name), name


def test_tensor_creation():
    """Iris's tests/unittests/test_tensor_creation.py calls: sizes, devices, the out= check in Iris's
    words, the layout check, and the four factories over ctx.heap (their blocks poisoned first)."""
    from iris import tensor_creation as tc
    assert tc.parse_size((2, 3)) == ((2, 3), 6) and tc.parse_size(((2, 3),)) == ((2, 3), 6)
    assert tc.parse_size(([4, 5],)) == ([4, 5], 20) and tc.parse_size(((),)) == ((), 1)
    assert tc.parse_size((7,)) == ((7,), 7)
    with pytest.raises(TypeError, match="sizes must be ints"):
        tc.parse_size((2.5,))
    cuda = torch.device("cuda:0")
    assert tc.is_valid_device(None, cuda) and tc.is_valid_device("cuda", cuda) and tc.is_valid_device(cuda, cuda)
    assert not tc.is_valid_device("cpu", cuda) and not tc.is_valid_device("cuda:1", cuda)
    with pytest.raises(RuntimeError, match="the heap lives on cuda:0; got device='cpu'") as e:
        tc.throw_if_invalid_device("cpu", cuda)
    assert isinstance(e.value, FactoryArgumentError)
    tc.throw_if_invalid_device("cuda", cuda)
    t = torch.full((2, 3), -5.0)
    assert tc.apply_layout(t, torch.strided) is t
    with pytest.raises(ValueError, match="layout must be torch.strided"):
        tc.apply_layout(t, torch.sparse_coo)

    with iris.iris(heap_size=1 << 22) as ctx:
        heap, dev = ctx.heap, ctx.get_device()
        out = heap.allocate(4, torch.float32)
        for args, words in (((out, 9, torch.float32), "4 elements, but 9 are required"),
                            ((heap.allocate(9, torch.int32), 9, torch.float32),
                             "dtype torch.int32, but torch.float32 is required"),
                            ((torch.zeros(9), 9, torch.float32), "not on the symmetric heap")):
            with pytest.raises(RuntimeError, match=words):
                tc.throw_if_invalid_output_tensor(heap, *args)
        tc.throw_if_invalid_output_tensor(heap, heap.allocate(9, torch.float32), 9, torch.float32)

        def poisoned_then(make, shape, dtype):
            poison = ctx.full(shape, -77, dtype=dtype)  # freed at once: the next block of its size reuses it
            ctx.free(poison)
            got = make()
            assert ctx.is_symmetric(got) and got.shape == shape and got.dtype == dtype
            return got

        got = poisoned_then(lambda: tc.zeros(heap, dev, (2, 3), dtype=torch.float32), (2, 3), torch.float32)
        assert torch.equal(got, torch.zeros(2, 3))
        got = poisoned_then(lambda: tc.ones(heap, dev, (4,), dtype=torch.int32), (4,), torch.int32)
        assert torch.equal(got, torch.ones(4, dtype=torch.int32))
        got = poisoned_then(lambda: tc.full(heap, dev, (5,), 3.25, dtype=torch.float32), (5,), torch.float32)
        assert torch.equal(got, torch.full((5,), 3.25))
        src = ctx.full((3, 3), 2.0, dtype=torch.float64)
        got = poisoned_then(lambda: tc.zeros_like(heap, dev, src), (3, 3), torch.float64)
        assert torch.equal(got, torch.zeros(3, 3, dtype=torch.float64))
        with pytest.raises(RuntimeError, match="the heap lives on"):
            tc.zeros(heap, dev, (2,), device="meta")
