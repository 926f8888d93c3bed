"""`iris bench`: run the source tree's benchmarks here, then compare iris with its references.

On GPUs the references are the copy engine, NCCL (where every rank has its own GPU) and torch's
symmetric memory. Without a GPU the benchmarks run on the host driver, kernels in Triton's
interpreter, against a CPU copy and gloo: only the ratios that mean something there are printed.

Each benchmark runs as its own job (`python -m iris.run -n N benchmarks/NAME.py --out DIR/NAME.json`)
so that one that fails or hangs costs only its own row. The numbers are read back from the JSON
files (iris/cli/report.py), never from the benchmarks' printed output.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import re
import socket
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Dict, List, Optional

MiB = 1 << 20


def gpu_per_rank(gpus: int, nprocs: int) -> Optional[str]:
    """Why NCCL cannot be the reference here, or None: it needs GPUs, and refuses two ranks on one."""
    if not gpus:
        return "needs a GPU per rank (NCCL is its reference); this machine has none"
    if nprocs > gpus:
        return f"NCCL needs a GPU per rank; {nprocs} ranks share {gpus} GPU(s) (pass -n {gpus} or fewer)"
    return None


@dataclass(frozen=True)
class Benchmark:
    """One script of benchmarks/ and the arguments that size it, per (gpu, quick)."""

    name: str
    what: str
    args: Dict[tuple, List[str]] = field(default_factory=dict)  # (on_gpu, quick) -> extra arguments
    needs: Callable[[int, int], Optional[str]] = lambda gpus, nprocs: None  # (gpus, ranks) -> why it cannot run


BENCHMARKS = (
    Benchmark("rma_bandwidth", "put/get bandwidth and signal/barrier latency vs the copy engine and NCCL", {
        (True, True): ["--max-bytes", str(64 * MiB), "--latency-rounds", "1000"],
        (True, False): [],
        # the host runs kernels in the Triton interpreter: only tiny sizes make sense there
        (False, True): ["--dry-run"], (False, False): ["--dry-run"]}),
    Benchmark("alloc_cost", "cost of one collective allocation vs torch symmetric memory", {
        (True, True): ["--counts", "1", "10", "--heap-gib", "1"], (True, False): [],
        (False, True): ["--counts", "1", "10", "--heap-gib", "1"],
        (False, False): ["--counts", "1", "10", "100", "--heap-gib", "1"]}),
    Benchmark("import_weights", "making weights symmetric: zero copy vs a copy vs torch symmetric memory", {
        (True, True): ["--gib", "1", "--tensor-mib", "64"], (True, False): [],
        (False, True): ["--gib", "0.0625", "--tensor-mib", "16"], (False, False): []}),
    Benchmark("collectives", "all_reduce, all_gather, reduce_scatter, all_to_all vs NCCL, eager and graph", {
        (True, True): ["--max-bytes", str(MiB), "--samples", "3"], (True, False): []}, needs=gpu_per_rank),
)


def benchmarks_dir() -> Path:
    """benchmarks/ beside the package: present in a source checkout (or an editable install) only."""
    import iris
    return Path(iris.__file__).resolve().parents[1] / "benchmarks"


def declared_options(script: Path) -> set:
    """The --options a script's argparse declares, read from its source so that nothing is started."""
    return set(re.findall(r"add_argument\(\s*[\"'](--[\w-]+)", script.read_text()))


def fit_args(args: List[str], declared: set):
    """Keep the options (with their values) that the script declares; return (kept, dropped)."""
    kept, dropped, keep = [], [], True
    for a in args:
        if a.startswith("--"):
            keep = a in declared
            (kept if keep else dropped).append(a)
        elif keep:
            kept.append(a)
    return kept, dropped


def gpu_count() -> int:
    from ..platform import detect
    if detect() == "host":
        return 0
    import torch
    return torch.cuda.device_count()


def free_port() -> int:
    """A port for the benchmark's torch.distributed store, so concurrent runs do not collide."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Progress:
    """tqdm where it is installed, else a text bar on stderr: redrawn in place on a terminal, one
    line per event in a log."""

    def __init__(self, total: int):
        self.total, self.done, self.name, self.t0 = total, 0, "", time.monotonic()
        try:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="bench", file=sys.stderr, dynamic_ncols=True)
        except ImportError:
            self.bar = None
        self.tty = sys.stderr.isatty()

    def _line(self, text: str, final: bool) -> None:
        width = 24
        fill = width * self.done // max(1, self.total)
        line = f"[{'#' * fill}{'.' * (width - fill)}] {self.done}/{self.total} {text}"
        sys.stderr.write(("\r" + line.ljust(78) + ("\n" if final else "")) if self.tty else line + "\n")
        sys.stderr.flush()

    def begin(self, name: str) -> None:
        self.name, self.t0 = name, time.monotonic()
        if self.bar is not None:
            self.bar.set_description(name)
        else:
            self._line(f"{name} ...", False)

    def tick(self) -> None:
        """Elapsed time of the running benchmark: redrawn on a terminal, left out of logs."""
        elapsed = f"{time.monotonic() - self.t0:.0f} s"
        if self.bar is not None:
            self.bar.set_postfix_str(elapsed)
        elif self.tty:
            self._line(f"{self.name} {elapsed}", False)

    def end(self, status: str) -> None:
        self.done += 1
        if self.bar is not None:
            self.bar.set_description(f"{self.name}: {status}")
            self.bar.update(1)
        else:
            self._line(f"{self.name}: {status} ({time.monotonic() - self.t0:.0f} s)", True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def run_one(b: Benchmark, script: Path, nprocs: int, gpu: bool, quick: bool, out: Path, timeout: float,
            progress: Progress) -> dict:
    """Run one benchmark as its own job; its output goes to out/NAME.log. Returns its status record."""
    extra, dropped = fit_args(b.args.get((gpu, quick), []), declared_options(script))
    result = out / f"{b.name}.json"
    log = out / f"{b.name}.log"
    cmd = [sys.executable, "-m", "iris.run", "-n", str(nprocs), str(script), "--out", str(result), *extra]
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), PYTHONUNBUFFERED="1")
    record = {"name": b.name, "command": " ".join(cmd[1:]), "log": str(log), "json": None}
    if dropped:
        record["note"] = f"the script does not take {' '.join(dropped)}; ran without"
    start = time.monotonic()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, cwd=script.parents[1], env=env,
                                start_new_session=True)
        while proc.poll() is None:
            if time.monotonic() - start > timeout:
                os.killpg(proc.pid, 15)  # the job's whole process group: the launcher and its ranks
                proc.wait()
                break
            progress.tick()
            time.sleep(0.5)
    record["seconds"] = round(time.monotonic() - start, 1)
    if proc.returncode == 0 and result.exists():
        record.update(status="ok", json=str(result))
    else:
        timed_out = record["seconds"] > timeout
        record["status"] = "timed out" if timed_out else "failed"
        tail = log.read_text(errors="replace").strip().splitlines()[-5:]
        record["note"] = (f"ran past {timeout:.0f} s" if timed_out else f"exit code {proc.returncode}") + \
            (": " + " | ".join(tail) if tail else "") + f" (full output: {log})"
    return record


def main(argv=None) -> int:
    from . import report
    about = " ".join(__doc__.split("\n\n")[:2]).replace("\n", " ")  # what it runs, and where
    parser = argparse.ArgumentParser(prog="iris bench", description=about)
    parser.add_argument("--quick", action="store_true", help="small sizes and counts: done in about a minute")
    parser.add_argument("--only", nargs="+", metavar="NAME", help=f"run only these ({', '.join(b.name for b in BENCHMARKS)})")
    parser.add_argument("--out", type=Path, default=None, help="folder for the JSON, logs, table and plot "
                                                               "(default ./iris-bench-DATE-TIME)")
    parser.add_argument("-n", "--nprocs", type=int, default=None, help="ranks (default: one per GPU, at least 2)")
    parser.add_argument("--timeout", type=float, default=None, help="seconds per benchmark (default 120 quick, 1800)")
    parser.add_argument("--benchmarks-dir", type=Path, default=None, help="where the scripts are (default: "
                                                                          "benchmarks/ of the source tree)")
    opts = parser.parse_args(argv)

    folder = (opts.benchmarks_dir or benchmarks_dir()).resolve()
    if not folder.is_dir():
        print(f"iris bench: no benchmarks folder at {folder}. The benchmarks ship with the source tree, not the "
              "wheel: clone the repository and run `pip install -e .` there (or pass --benchmarks-dir).",
              file=sys.stderr)
        return 2
    chosen = list(BENCHMARKS)
    if opts.only:
        unknown = sorted(set(opts.only) - {b.name for b in BENCHMARKS})
        if unknown:
            parser.error(f"unknown benchmark(s) {unknown}; choose from {[b.name for b in BENCHMARKS]}")
        chosen = [b for b in BENCHMARKS if b.name in opts.only]
    gpus = gpu_count()
    nprocs = opts.nprocs or max(2, gpus)
    if nprocs < 2:
        parser.error(f"-n must be at least 2, got {nprocs}")
    timeout = opts.timeout or (120.0 if opts.quick else 1800.0)
    out = opts.out or Path(f"iris-bench-{datetime.datetime.now():%Y%m%d-%H%M%S}")
    out = out.resolve()  # the jobs run in the source tree's root
    out.mkdir(parents=True, exist_ok=True)
    if gpus:
        refs = "NCCL" if not gpu_per_rank(gpus, nprocs) else "no NCCL: ranks share GPUs"
        where = f"on {gpus} GPU(s), {nprocs} ranks ({refs})"
    else:
        where = (f"on the host driver (no GPU), {nprocs} ranks: kernels run in Triton's interpreter, compared "
                 "against a CPU copy and gloo; interpreted times get no ratio")
    print(f"iris bench: {len(chosen)} benchmark(s) {where}{' (quick)' if opts.quick else ''}; output in {out}/",
          flush=True)

    records, progress = [], Progress(len(chosen))
    try:
        for b in chosen:
            script = folder / f"{b.name}.py"
            progress.begin(b.name)
            why = b.needs(gpus, nprocs)
            if not script.exists():
                records.append({"name": b.name, "status": "skipped", "note": f"{script} does not exist (yet)"})
            elif why:
                records.append({"name": b.name, "status": "skipped", "note": why})
            else:
                records.append(run_one(b, script, nprocs, gpus > 0, opts.quick, out, timeout, progress))
            progress.end(records[-1]["status"])
    finally:
        progress.close()

    summary = report.report(records, out, {"gpus": gpus, "nprocs": nprocs, "quick": opts.quick})
    print(report.render(summary))
    with open(out / "summary.json", "w") as f:
        json.dump(summary, f, indent=1, default=str)
    print(f"wrote {out / 'summary.json'}" + (f" and {summary['plot']}" if summary.get("plot") else ""))
    return 1 if any(r["status"] in ("failed", "timed out") for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
