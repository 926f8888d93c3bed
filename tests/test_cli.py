"""`iris info` and `iris bench` as a user runs them: real subprocesses on the host driver."""
import importlib.util
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from iris.cli import bench, report

ROOT = Path(__file__).resolve().parents[1]


def iris_cli(*args, env=None, timeout=120):
    full = {k: v for k, v in os.environ.items() if k not in ("IRIS_PLATFORM", "IRIS_ALLOCATOR")}
    full.update(env or {})
    return subprocess.run([sys.executable, "-m", "iris", *args], cwd=ROOT, env=full, capture_output=True, text=True,
                          timeout=timeout)


def on_host() -> bool:
    import torch
    return not torch.cuda.is_available()


# -- iris info -------------------------------------------------------------------------------------
@pytest.mark.skipif(not on_host(), reason="checks the host platform's report")
def test_info_on_host():
    p = iris_cli("info")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "iris can run here" in p.stdout
    assert "platform     host" in p.stdout
    assert "VMM          works; POSIX fd export works" in p.stdout
    assert "torch" in p.stdout and "triton" in p.stdout


def test_info_json():
    p = iris_cli("info", "--json", env={"IRIS_PLATFORM": "host"})
    assert p.returncode == 0, p.stdout + p.stderr
    info = json.loads(p.stdout)
    assert info["can_run"] is True and info["problems"] == []
    assert info["platform"]["name"] == "host" and "IRIS_PLATFORM" in info["platform"]["why"]
    assert info["memory"]["vmm"] == "works" and info["memory"]["fd_export"] == "works"
    assert info["memory"]["granularity"] == os.sysconf("SC_PAGE_SIZE")
    assert info["memory"]["allocators"] == {"torch": True, "vmem": True,
                                            "nvshmem": info["memory"]["nvshmem"].startswith("usable")}
    assert info["libraries"]["torch"] and info["libraries"]["triton"]
    assert info["devices"][0]["memory_bytes"] > 0
    assert info["launch"].startswith("python -m iris.run -n 2")


def test_info_bad_platform_says_so():
    p = iris_cli("info", env={"IRIS_PLATFORM": "nonsense"})
    out = p.stdout + p.stderr
    assert p.returncode != 0
    assert "IRIS_PLATFORM='nonsense' is not a platform" in out and "cuda, hip, host" in out
    assert "Traceback" not in out and "fix:" in out


def test_info_bad_settings_are_problems():
    p = iris_cli("info", "--json", env={"IRIS_PLATFORM": "host", "IRIS_ALLOCATOR": "bump", "IRIS_TIMEOUT": "-1",
                                        "IRIS_CHECK_SYMMETRY": "sometimes"})
    assert p.returncode == 1
    problems = " ".join(x["problem"] for x in json.loads(p.stdout)["problems"])
    assert "IRIS_ALLOCATOR='bump'" in problems and "IRIS_TIMEOUT='-1'" in problems
    assert "IRIS_CHECK_SYMMETRY='sometimes'" in problems


def test_info_cuda_without_bindings_says_what_to_install():
    """`iris info` where cuda-bindings cannot be imported (hidden from this process if it is installed)."""
    hide = "import sys; sys.modules['cuda'] = None; from iris.cli.__main__ import main; sys.exit(main(['info']))"
    env = {k: v for k, v in os.environ.items() if k != "IRIS_ALLOCATOR"}
    p = subprocess.run([sys.executable, "-c", hide], cwd=ROOT, env=dict(env, IRIS_PLATFORM="cuda"), capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 1
    assert "iris CANNOT run here" in p.stdout
    assert "cuda-bindings" in p.stdout and "pip install 'iris-shmem[cuda]'" in p.stdout


@pytest.mark.skipif(shutil.which("iris") is None, reason="the console script is not installed")
def test_console_script():
    p = subprocess.run(["iris", "info", "--json"], capture_output=True, text=True, timeout=120,
                       env=dict(os.environ, IRIS_PLATFORM="host"))
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["platform"]["name"] == "host"


def test_usage():
    p = iris_cli()
    assert p.returncode == 0
    for name in ("info", "bench", "run"):
        assert f"  {name} " in p.stdout, p.stdout
    p = iris_cli("frobnicate")
    assert p.returncode == 2 and "unknown command 'frobnicate'" in p.stderr


def test_every_command_parses_its_own_options():
    from iris.cli.__main__ import COMMANDS
    for name in COMMANDS:
        p = iris_cli(name, "--help")
        assert p.returncode == 0 and p.stdout.startswith("usage:"), (name, p.stdout, p.stderr)
    p = subprocess.run([sys.executable, "-m", "iris.run", "--help"], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "python -m iris.run" in p.stdout, p.stdout + p.stderr


def test_public_names_survive_submodule_imports():
    """iris.launch is the launcher function whatever iris's own modules import later."""
    code = ("import iris, iris.ops, iris.ccl, iris.cli.info, iris.cli.bench; "
            "from iris.distributed import launch; assert iris.launch is launch, iris.launch")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr


# -- iris bench -------------------------------------------------------------------------------------
@pytest.mark.skipif(not on_host(), reason="the quick run on GPUs is for people, not CI")
def test_bench_quick_on_host(tmp_path):
    p = iris_cli("bench", "--quick", "--out", str(tmp_path), timeout=240)
    assert p.returncode == 0, p.stdout + p.stderr
    for name in ("rma_bandwidth", "alloc_cost", "import_weights"):
        assert (tmp_path / f"{name}.json").exists(), (name, p.stdout)
        assert (tmp_path / f"{name}.log").exists()
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [b["status"] for b in summary["benchmarks"]] == ["ok"] * 3 + ["skipped"]
    assert "collectives: skipped: needs a GPU per rank (NCCL is its reference)" in p.stdout, p.stdout
    names = {r["benchmark"] for r in summary["table"]}
    assert names == {"rma_bandwidth", "alloc_cost", "import_weights"}
    first = p.stdout.splitlines()[0]
    assert "on the host driver (no GPU)" in first and "against a CPU copy" in first, first
    assert "put bandwidth" in p.stdout and "gloo send/recv" in p.stdout and "iris x" in p.stdout
    assert "CPU copy (torch copy_)" in p.stdout and "copy engine" not in p.stdout, p.stdout
    # interpreted kernels against a CPU copy: no ratio; zero extra bytes: no ratio either (not inf)
    for r in summary["table"]:
        if r["benchmark"] == "rma_bandwidth" or r["iris"] == 0:
            assert r["speedup"] is None, r
    ratios = [line.split()[-1] for line in p.stdout.splitlines() if line.startswith(tuple(names))]
    assert "inf" not in ratios and not any(x.startswith("0.0") for x in ratios), p.stdout
    zero_copy = next(r for r in summary["table"] if r["benchmark"] == "import_weights" and r["unit"] == "ms"
                     and r["reference"] == "iris copy into heap")
    assert zero_copy["speedup"], zero_copy  # mapping against a copy: a ratio that means something here
    if importlib.util.find_spec("matplotlib"):
        assert (tmp_path / "bandwidth.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert "pip install 'iris-shmem[trace]'" in p.stdout


FAKE = """import argparse, json, sys
ap = argparse.ArgumentParser()
ap.add_argument("--out")
args = ap.parse_args()
if {fail}:
    print("something broke", file=sys.stderr)
    sys.exit(3)
import os
if os.environ["IRIS_RANK"] == "0":
    json.dump({{"summary": [{{"measure": "widgets", "unit": "w/s", "iris": 30.0, "reference": "ref",
                             "reference_value": 10.0}}]}}, open(args.out, "w"))
"""


def test_bench_skips_missing_and_reports_failures(tmp_path):
    scripts = tmp_path / "benchmarks"
    scripts.mkdir()
    (scripts / "alloc_cost.py").write_text(FAKE.format(fail=False))
    (scripts / "import_weights.py").write_text(FAKE.format(fail=True))
    out = tmp_path / "out"
    p = iris_cli("bench", "--quick", "--benchmarks-dir", str(scripts), "--out", str(out), env={"IRIS_PLATFORM": "host"})
    assert p.returncode == 1, p.stdout + p.stderr  # one benchmark failed
    summary = json.loads((out / "summary.json").read_text())
    status = {b["name"]: b for b in summary["benchmarks"]}
    assert status["rma_bandwidth"]["status"] == "skipped" and "does not exist" in status["rma_bandwidth"]["note"]
    assert status["alloc_cost"]["status"] == "ok"
    assert "does not take --counts --heap-gib" in status["alloc_cost"]["note"]
    assert status["import_weights"]["status"] == "failed" and "something broke" in status["import_weights"]["note"]
    assert summary["table"] == [report.row("alloc_cost", "widgets", "w/s", 30.0, "ref", 10.0, True)]
    assert "3.00" in p.stdout and "note: rma_bandwidth: skipped" in p.stdout


def test_bench_without_benchmarks_folder(tmp_path):
    p = iris_cli("bench", "--benchmarks-dir", str(tmp_path / "nowhere"))
    assert p.returncode == 2
    assert "no benchmarks folder" in p.stderr and "pip install -e ." in p.stderr


def test_bench_locates_the_source_tree():
    assert bench.benchmarks_dir() == ROOT / "benchmarks"


def test_fit_args_keeps_declared_options_only():
    kept, dropped = bench.fit_args(["--counts", "1", "10", "--quick", "--heap-gib", "1"], {"--counts", "--heap-gib"})
    assert kept == ["--counts", "1", "10", "--heap-gib", "1"] and dropped == ["--quick"]
    declared = bench.declared_options(ROOT / "benchmarks" / "alloc_cost.py")
    for b in bench.BENCHMARKS:  # the quick arguments match the real scripts' options
        script = ROOT / "benchmarks" / f"{b.name}.py"
        if script.exists():
            for args in b.args.values():
                assert bench.fit_args(args, bench.declared_options(script))[1] == [], (b.name, args)
    assert "--counts" in declared


def test_report_readers_on_gpu_shaped_results(tmp_path):
    """The readers and the plot on results shaped like a two-GPU run's (numbers made up)."""
    rma = {"device": "NVIDIA H200", "dry_run": False, "ranks": 2,
           "point_to_point": [{"bytes": b, "put_GBps": 0.9 * g, "get_GBps": 0.95 * g, "copy_engine_GBps": g,
                               "copy_peer_map_GBps": g, "nccl_sendrecv_GBps": 0.9 * g}
                              for b, g in ((1 << 20, 100.0), (1 << 30, 400.0))],
           "all_pairs": [{"bytes_per_pair": 1 << 20, "iris_GBps": 300.0, "nccl_all_to_all_GBps": 200.0}],
           "latency": {"signal_one_way_us": 2.0, "device_barrier_eager_us": 5.0, "nccl_all_reduce_int_eager_us": 20.0}}
    rows = report.rma_bandwidth(rma)
    put_ce = next(r for r in rows if r["measure"] == "put bandwidth, 1 GiB" and r["reference"].startswith("copy"))
    assert put_ce["iris"] == 360.0 and put_ce["speedup"] == pytest.approx(0.9)
    barrier = next(r for r in rows if r["measure"] == "barrier (eager)")
    assert barrier["reference"].startswith("NCCL") and barrier["speedup"] == pytest.approx(4.0)  # lower is better
    alloc = {"bytes_per_allocation": 1 << 20, "rows": [
        {"allocator": "vmem", "case": "inside mapped", "n": 10, "mean_us": 10.0},
        {"allocator": "torch symm_mem", "case": "empty + rendezvous", "n": 10, "mean_us": 3500.0}]}
    (row,) = report.alloc_cost(alloc)
    assert row["speedup"] == pytest.approx(350.0)
    weights = {"bytes_per_rank": 1 << 30, "ranks": [[
        {"method": "iris as_symmetric zero copy, one batched call", "ms": 2.0, "extra_bytes": 0},
        {"method": "iris copy into heap", "ms": 20.0, "extra_bytes": 1 << 30},
        {"method": "torch symm_mem empty+rendezvous+copy", "ms": 40.0, "extra_bytes": 1 << 30}]]}
    rows = report.import_weights(weights)
    assert [r["speedup"] for r in rows[:2]] == [10.0, 20.0]
    assert rows[2]["iris"] == 0 and rows[2]["reference_value"] == 1024 and rows[2]["speedup"] is None
    text = report.render({"table": rows, "notes": []})
    assert "inf" not in text and text.splitlines()[-2].split()[-1] == "-"  # zero extra bytes: no ratio
    if importlib.util.find_spec("matplotlib"):
        assert report.plot_bandwidth(rma, tmp_path / "bw.png") == str(tmp_path / "bw.png")
        assert (tmp_path / "bw.png").stat().st_size > 1000


def test_report_names_references_that_could_not_run(tmp_path):
    """Results of a job whose ranks share one GPU: NCCL and symm_mem skipped with their reasons, iris's
    rows and the copy engine's reference still in the table."""
    why = "NCCL needs a GPU per rank; 2 ranks share 1 GPU(s)"
    rma = {"device": "NVIDIA H200", "dry_run": False, "ranks": 2, "references_skipped": {"NCCL": why},
           "point_to_point": [{"bytes": 1 << 30, "put_GBps": 600.0, "get_GBps": 610.0, "copy_engine_GBps": 640.0,
                               "nccl_sendrecv_GBps": None}],
           "all_pairs": [{"bytes_per_pair": 1 << 20, "iris_GBps": 300.0, "nccl_all_to_all_GBps": None}],
           "latency": {"device_barrier_eager_us": 5.0}}
    rows = report.rma_bandwidth(rma)
    nccl = [r for r in rows if "NCCL" in r["reference"]]
    assert len(nccl) == 4 and all(r["reference"] == f"- (NCCL skipped: {why})" and r["speedup"] is None
                                  for r in nccl), rows
    put_ce = next(r for r in rows if r["measure"] == "put bandwidth, 1 GiB" and r["reference"].startswith("copy"))
    assert put_ce["speedup"] == pytest.approx(600.0 / 640.0)
    alloc = {"bytes_per_allocation": 1 << 20, "references_skipped": {"torch symm_mem": "RuntimeError: no"},
             "rows": [{"allocator": "vmem", "case": "inside mapped", "n": 10, "mean_us": 10.0}]}
    (row,) = report.alloc_cost(alloc)
    assert row["reference"] == "- (torch symm_mem skipped: RuntimeError: no)" and row["iris"] == 10.0
    weights = {"bytes_per_rank": 1 << 30, "ranks": [[
        {"method": "iris as_symmetric zero copy, one batched call", "ms": 2.0, "extra_bytes": 0},
        {"method": "iris copy into heap", "ms": 20.0, "extra_bytes": 1 << 30},
        {"method": "torch symm_mem skipped", "reason": "RuntimeError: no"}]]}
    rows = report.import_weights(weights)
    assert rows[1]["reference"] == "- (torch symm_mem skipped: RuntimeError: no)" and rows[0]["speedup"] == 10.0
    text = report.render({"table": report.rma_bandwidth(rma) + rows, "notes": []})
    assert "no results to compare" not in text and "NCCL skipped" in text


def test_help_says_where_bench_runs():
    p = iris_cli("bench", "--help")
    assert p.returncode == 0 and "on the GPUs here" not in p.stdout, p.stdout
    assert "host driver" in " ".join(p.stdout.split()) and "NCCL (where every rank has its own GPU)" in \
        " ".join(p.stdout.split()), p.stdout


def test_collectives_need_a_gpu_per_rank():
    assert bench.gpu_per_rank(4, 4) is None and bench.gpu_per_rank(4, 2) is None
    assert bench.gpu_per_rank(1, 2) == "NCCL needs a GPU per rank; 2 ranks share 1 GPU(s) (pass -n 1 or fewer)"
    assert "this machine has none" in bench.gpu_per_rank(0, 2)


def test_report_reads_the_collectives_results(tmp_path):
    """The reader on the JSON of a real 2-GPU run (benchmarks/results/): one row per collective and
    size, CUDA graph times against NCCL's, the ratio NCCL's time over iris's."""
    data = json.loads((ROOT / "benchmarks" / "results" / "collectives-gpu-2ranks.json").read_text())
    rows = report.table_rows("collectives", data)
    assert len(rows) == len(data["all_reduce"]) + 3 * len(data["moves"])
    first = rows[0]
    assert first["measure"] == "all_reduce 1 KiB, graph" and first["reference"] == "NCCL all_reduce"
    assert first["iris"] == data["all_reduce"][0]["iris_graph_us"]
    assert first["speedup"] == pytest.approx(data["all_reduce"][0]["nccl_graph_us"] / first["iris"])
    a2a = [r for r in rows if r["measure"].startswith("all_to_all")]
    assert len(a2a) == len(data["moves"]) and all(r["speedup"] for r in a2a)
    data["moves"][0]["checked_vs_nccl"] = False  # a result that differed from NCCL's is said loudly
    (tmp_path / "collectives.json").write_text(json.dumps(data))
    summary = report.report([{"name": "collectives", "status": "ok", "json": str(tmp_path / "collectives.json")}],
                            tmp_path, {})
    assert "collectives: 1 row(s) with checked_vs_nccl=false: iris moved WRONG data there" in summary["notes"]


@pytest.mark.gpu
def test_bench_collectives_against_nccl_with_a_gpu_per_rank(tmp_path):
    """Every GPU here a rank (2 or 4): the collectives run against NCCL, every row has a ratio, and
    every result was checked against NCCL's."""
    import torch
    gpus = torch.cuda.device_count()
    if gpus < 2:
        pytest.skip("needs two GPUs or more, one per rank")
    p = iris_cli("bench", "--quick", "--only", "collectives", "-n", str(gpus), "--timeout", "600",
                 "--out", str(tmp_path), timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.splitlines()[0].startswith(f"iris bench: 1 benchmark(s) on {gpus} GPU(s), {gpus} ranks (NCCL)")
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [b["status"] for b in summary["benchmarks"]] == ["ok"], summary["benchmarks"]
    rows = summary["table"]
    for name in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
        mine = [r for r in rows if r["measure"].startswith(name + " ")]
        assert mine and all(r["reference"] == f"NCCL {name}" and r["speedup"] for r in mine), (name, mine)
    assert not any("WRONG" in n for n in summary["notes"]), summary["notes"]


@pytest.mark.gpu
def test_bench_quick_on_one_gpu_with_two_ranks(tmp_path):
    """Two ranks on one GPU (CUDA_VISIBLE_DEVICES=0): every benchmark runs, NCCL's references are
    skipped with the reason in the table, and the copy engine's reference stays."""
    p = iris_cli("bench", "--quick", "-n", "2", "--out", str(tmp_path), env={"CUDA_VISIBLE_DEVICES": "0"},
                 timeout=900)
    assert p.returncode == 0, p.stdout + p.stderr
    summary = json.loads((tmp_path / "summary.json").read_text())
    assert [b["status"] for b in summary["benchmarks"]] == ["ok"] * 3 + ["skipped"], summary["benchmarks"]
    assert "NCCL skipped: NCCL needs a GPU per rank; 2 ranks share 1 GPU(s)" in p.stdout, p.stdout
    assert "collectives: skipped: NCCL needs a GPU per rank; 2 ranks share 1 GPU(s)" in p.stdout, p.stdout
    assert any(r["reference"].startswith("copy engine") and r["speedup"] for r in summary["table"]), p.stdout
    assert "no results to compare" not in p.stdout
