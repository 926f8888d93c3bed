"""Do the driver's VMM sharing calls overlap when made from several threads? If they did, an
import could hide its exports behind its maps; they do not (the driver serializes them), which is
why as_symmetric's floor is the sum of its driver calls. One GPU, one process.

    python benchmarks/driver_threads.py [--pages 410] [--page-mib 20]

Creates as many pages as PyTorch's expandable segments make for 8 GiB, then times, in one run:
exporting them all (the first export of a page, then a repeat) on 1, 2, 4 and 8 threads; importing
them on 1 and 4 threads; cuMemSetAccess of the whole range alone and beside the exports.
"""
import argparse
import os
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import write_result  # noqa: E402

from iris.platform.cuda import CudaDriver  # noqa: E402


def _timed(threads, fn, items):
    t0 = time.perf_counter()
    if threads == 1:
        out = [fn(x) for x in items]
    else:
        with ThreadPoolExecutor(threads) as ex:
            out = list(ex.map(fn, items))
    return 1e3 * (time.perf_counter() - t0), out


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pages", type=int, default=410)
    ap.add_argument("--page-mib", type=int, default=20)
    args = ap.parse_args()
    torch.empty(1, device="cuda")
    d, n, size = CudaDriver(), args.pages, args.page_mib << 20
    pages = [d.create(size) for _ in range(n)]
    rows = []
    for label, threads in (("export, first", 1), ("export, repeat", 1), ("export", 2), ("export", 4), ("export", 8)):
        ms, fds = _timed(threads, d.export, pages)
        rows.append({"call": label, "threads": threads, "ms": ms})
        if threads != 4:
            for fd in fds:
                os.close(fd)
        else:
            keep = fds
    for threads in (1, 4):
        ms, handles = _timed(threads, d.import_, keep)
        rows.append({"call": "import", "threads": threads, "ms": ms})
        for h in handles:
            d.release(h)
    for fd in keep:
        os.close(fd)
    spans = []
    for _ in range(2):
        va = d.reserve(n * size)
        for i, h in enumerate(pages):
            d.map(va + i * size, size, h)
        spans.append(va)
    ms, _ = _timed(1, lambda va: d.set_access(va, n * size), [spans[0]])
    rows.append({"call": "set_access, alone", "threads": 1, "ms": ms})
    ms_export, _ = _timed(1, d.export, pages)  # a repeat export alone, the reference for the next row
    with ThreadPoolExecutor(1) as ex:
        t0 = time.perf_counter()
        f = ex.submit(d.set_access, spans[1], n * size)
        _, fds = _timed(1, d.export, pages)
        f.result()
        both = 1e3 * (time.perf_counter() - t0)
    for fd in fds:
        os.close(fd)
    rows.append({"call": "set_access on a thread beside repeat exports", "threads": 2, "ms": both,
                 "in_sequence_ms": rows[-1]["ms"] + ms_export})
    for va in spans:
        for i in range(n):
            d.unmap(va + i * size, size)
        d.free_va(va, n * size)
    for h in pages:
        d.release(h)
    print(f"{n} pages of {args.page_mib} MiB on {torch.cuda.get_device_name()}")
    for r in rows:
        extra = f" (in sequence {r['in_sequence_ms']:.1f})" if "in_sequence_ms" in r else ""
        print(f"{r['call']:>46} {r['threads']} threads {r['ms']:8.1f} ms{extra}")
    print("wrote", write_result("driver_threads", {"pages": n, "page_bytes": size, "rows": rows}))


if __name__ == "__main__":
    main()
