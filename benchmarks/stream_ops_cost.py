"""Host cost of the calls a reuse with peers queues: the progress counter's write and wait, each way
iris could make them, against torch.empty + del, in one process on one GPU.

    python benchmarks/stream_ops_cost.py [--reps 4000]

Per call, the median over batches of 25 calls (batches of each way interleaved with torch.empty +
del), the lowest of three rounds: iris's driver (cuda-bindings, its return code checked), the bare
cuda-bindings call, libcuda's entry point through ctypes, one cuStreamBatchMemOp carrying a write
and a wait, and the two torch queries the GPU path makes (the current stream, whether it captures).
A reuse with N peers waits for N counters: iris's waiter (one cuStreamBatchMemOp of N waits) against
N cuStreamWaitValue64 calls one by one, for N = 1, 3 and 7 (2, 4 and 8 ranks). The waits are for a
value the words already hold, so the stream never stalls. Writes
benchmarks/results/stream_ops_cost-gpu-1ranks.json.
"""
import argparse
import ctypes
import statistics
import sys

import torch

sys.path.insert(0, __file__.rsplit("/", 1)[0])
from common import batched, write_result  # noqa: E402


def _ways(dev):
    """name -> a no-argument call; names whose set-up failed map to the error instead."""
    from cuda.bindings import driver as cu
    from iris.platform import get_driver
    driver = get_driver("cuda")
    word = torch.zeros(8, dtype=torch.int64, device=dev)
    addr, index = word.data_ptr(), dev.index
    words = [addr + 8 * i for i in range(8)]
    raw_stream = torch._C._cuda_getCurrentRawStream
    geq = cu.CUstreamWaitValue_flags.CU_STREAM_WAIT_VALUE_GEQ
    ways = {
        "torch.empty + del": lambda: torch.empty(1024, dtype=torch.float32, device=dev),
        "iris driver.stream_write": lambda: driver.stream_write(raw_stream(index), addr, 0),
        "cuda-bindings cuStreamWriteValue64": lambda: cu.cuStreamWriteValue64(raw_stream(index), addr, 0, 0),
        "cuda-bindings cuStreamWaitValue64": lambda: cu.cuStreamWaitValue64(raw_stream(index), addr, 0, geq),
        "torch current raw stream": lambda: raw_stream(index),
        "torch.cuda.is_current_stream_capturing": torch.cuda.is_current_stream_capturing,
    }
    for n in (1, 3, 7):
        waiter = driver.stream_waiter(words[:n])
        ways[f"iris driver.stream_waiter, {n} peer(s)"] = lambda waiter=waiter: waiter(raw_stream(index), 0)
        ways[f"cuda-bindings cuStreamWaitValue64 x {n}, one by one"] = (
            lambda n=n: [cu.cuStreamWaitValue64(raw_stream(index), a, 0, geq) for a in words[:n]])
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        write, wait = lib.cuStreamWriteValue64_v2, lib.cuStreamWaitValue64_v2
        for f in (write, wait):
            f.argtypes = (ctypes.c_void_p, ctypes.c_uint64, ctypes.c_uint64, ctypes.c_uint)
            f.restype = ctypes.c_int
        flag = int(geq)
        ways["ctypes cuStreamWriteValue64_v2"] = lambda: write(raw_stream(index), addr, 0, 0)
        ways["ctypes cuStreamWaitValue64_v2"] = lambda: wait(raw_stream(index), addr, 0, flag)
    except Exception as e:  # noqa: BLE001
        ways["ctypes cuStreamWriteValue64_v2"] = f"{type(e).__name__}: {e}"
    try:
        ops = [cu.CUstreamBatchMemOpParams(), cu.CUstreamBatchMemOpParams()]
        ops[0].writeValue.operation = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WRITE_VALUE_64
        ops[0].writeValue.address = addr
        ops[0].writeValue.value64 = 0
        ops[0].writeValue.flags = 0
        ops[1].waitValue.operation = cu.CUstreamBatchMemOpType.CU_STREAM_MEM_OP_WAIT_VALUE_64
        ops[1].waitValue.address = addr
        ops[1].waitValue.value64 = 0
        ops[1].waitValue.flags = int(geq)
        err, = cu.cuStreamBatchMemOp(raw_stream(index), 2, ops, 0)
        if err != cu.CUresult.CUDA_SUCCESS:
            raise RuntimeError(f"cuStreamBatchMemOp returned {err}")

        def batch():
            ops[1].waitValue.value64 = 0  # what a real caller sets each time: the epoch
            cu.cuStreamBatchMemOp(raw_stream(index), 2, ops, 0)
        ways["cuda-bindings cuStreamBatchMemOp (write + wait)"] = batch
    except Exception as e:  # noqa: BLE001
        ways["cuda-bindings cuStreamBatchMemOp (write + wait)"] = f"{type(e).__name__}: {e}"
    return ways, word


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=4000)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    dev = torch.device("cuda", torch.cuda.current_device())
    ways, word = _ways(dev)
    runnable = {k: v for k, v in ways.items() if callable(v)}
    skipped = {k: v for k, v in ways.items() if not callable(v)}
    times = {k: [] for k in runnable}
    for _ in range(3):
        for name, fn in runnable.items():
            fn()
            torch.cuda.synchronize(dev)
            times[name].append(statistics.median(batched(fn, args.reps)))
            torch.cuda.synchronize(dev)
    ref = min(times["torch.empty + del"])
    rows = [{"call": k, "median_us": 1e6 * min(v), "ratio_to_torch_empty_del": min(v) / ref} for k, v in times.items()]
    for r in rows:
        print(f"{r['call']:>50} {r['median_us']:8.2f} us {r['ratio_to_torch_empty_del']:6.2f}x")
    for k, v in skipped.items():
        print(f"{k:>50} skipped: {v}")
    print("wrote", write_result("stream_ops_cost", {"reps": args.reps, "rows": rows, "skipped": skipped}, args.out))
    del word


if __name__ == "__main__":
    main()
