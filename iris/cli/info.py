"""`iris info`: what iris would run on here, and if it would not, why and what to do.

Everything is probed for real (the driver is loaded, one granularity-sized VMM handle is created,
mapped and exported), so a "yes" here means the calls iris makes at start-up work on this machine.
No heap is created and no other rank is needed.
"""
from __future__ import annotations

import argparse
import json
import os
import platform as _platform
import sys
from contextlib import ExitStack
from importlib import metadata

from .. import __version__, settings
from ..errors import DISTRIBUTION, DriverError, SettingError, pip_install
from .nvml_links import nvml_links
from ..platform import PLATFORMS, detect, get_driver

# distribution name -> what it is for; versions come from metadata, so nothing is imported for them
LIBRARIES = {
    DISTRIBUTION: "this package", "torch": "tensors, required", "triton": "kernels, required", "numpy": "required",
    "cuda-bindings": f"NVIDIA driver calls ({DISTRIBUTION}[cuda])",
    "hip-python": f"AMD driver calls ({DISTRIBUTION}[rocm])", "mpi4py": f"launching under mpirun ({DISTRIBUTION}[mpi])",
    "nvidia-ml-py": "GPU link report (NVML)",
}
EXTRA = {"cuda": ("cuda-bindings", pip_install("cuda")), "hip": ("hip-python", pip_install("rocm"))}


def _version(dist: str):
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return None


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def _size(n: int) -> str:
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if n >= 1 << shift and n % (1 << shift) == 0:
            return f"{n >> shift} {unit}"
    return f"{n} bytes"


class Report:
    """The facts found, and the problems (iris cannot run) and warnings (it can, with a catch)."""

    def __init__(self):
        self.data = {"iris": __version__, "python": _platform.python_version()}
        self.problems, self.warnings = [], []

    def problem(self, what: str, fix: str) -> None:
        self.problems.append({"problem": what, "fix": fix})

    def warn(self, what: str, fix: str = "") -> None:
        self.warnings.append({"warning": what, "fix": fix})

    def as_dict(self) -> dict:
        return {**self.data, "can_run": not self.problems, "problems": self.problems, "warnings": self.warnings}


# -- platform -----------------------------------------------------------------
def _gpu_hardware() -> str | None:
    """A GPU kernel driver visible in /dev or /proc, whatever torch says."""
    if os.path.exists("/proc/driver/nvidia/version") or os.path.exists("/dev/nvidiactl"):
        return "NVIDIA"
    if os.path.exists("/dev/kfd"):
        return "AMD"
    return None


def _platform_section(r: Report):
    try:
        name = detect()
    except ValueError as e:
        r.data["platform"] = {"name": None, "why": str(e)}
        if not isinstance(e, SettingError):  # a bad IRIS_PLATFORM is reported with the settings
            r.problem(str(e), f"unset IRIS_PLATFORM, or set it to one of {', '.join(PLATFORMS)}")
        return None
    import torch
    if settings.PLATFORM.is_set():
        why = f"forced by IRIS_PLATFORM={name}"
    elif name == "host":
        why = "torch sees no GPU (torch.cuda.is_available() is False); set IRIS_PLATFORM to force one"
        hw = _gpu_hardware()
        if hw:
            build = f"torch {torch.__version__} (CUDA {torch.version.cuda}, ROCm {getattr(torch.version, 'hip', None)})"
            r.warn(f"an {hw} GPU driver is present but {build} sees no GPU, so iris runs on the host",
                   "install a torch build for your GPU, and check CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES")
    elif name == "hip":
        why = f"torch is a ROCm build (HIP {torch.version.hip}) and sees {torch.cuda.device_count()} GPU(s)"
    else:
        why = f"torch sees {torch.cuda.device_count()} NVIDIA GPU(s) (CUDA {torch.version.cuda})"
    r.data["platform"] = {"name": name, "why": why}
    return name


def _driver_version(name: str) -> str:
    if name == "cuda":
        from cuda.bindings import driver as cu
        err, v = cu.cuDriverGetVersion()
        return f"CUDA driver API {v // 1000}.{v % 1000 // 10}" if err == cu.CUresult.CUDA_SUCCESS else f"unknown ({err.name})"
    if name == "hip":
        from hip import hip
        err, v = hip.hipDriverGetVersion()
        return f"HIP driver {v}" if err == hip.hipError_t.hipSuccess else f"unknown ({err.name})"
    try:
        interp = settings.INTERPRET.get()
    except SettingError:
        interp = False
    return (f"Linux {_platform.release()}: memfd_create + mmap; kernels in the Triton interpreter"
            + ("" if interp else " (TRITON_INTERPRET is not 1: set it, or import iris before triton)"))


def _driver_section(r: Report, name: str):
    try:
        driver = get_driver(name)
    except ImportError as e:
        dist, fix = EXTRA[name]
        r.data["driver"] = {"name": name, "error": str(e)}
        r.problem(f"the {name} driver needs {dist}, which cannot be imported ({e})", fix)
        return None
    try:
        count = driver.device_count()
        driver.set_device(0)
        version = _driver_version(name)
    except (DriverError, OSError) as e:
        r.data["driver"] = {"name": name, "error": str(e)}
        fix = ("check the GPU driver (nvidia-smi / rocm-smi), CUDA_VISIBLE_DEVICES, and that the installed driver "
               "is at least as new as cuda-bindings / hip-python" if name != "host" else "check /proc and memfd support")
        r.problem(f"the {name} driver does not start: {e}", fix)
        return None
    r.data["driver"] = {"name": name, "version": version, "device_count": count}
    if count < 1:
        r.problem(f"the {name} driver finds no device", "check the GPU driver and CUDA_VISIBLE_DEVICES/HIP_VISIBLE_DEVICES")
        return None
    return driver


# -- devices and links ----------------------------------------------------------
def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return _platform.processor() or _platform.machine()


def _devices_section(r: Report, driver) -> None:
    if driver.name == "host":
        free, total = driver.mem_info()
        r.data["devices"] = [{"index": 0, "name": f"{_cpu_name()} ({os.cpu_count()} cores)", "memory_bytes": total,
                              "free_bytes": free}]
        return
    import torch
    devices = []
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        d = {"index": i, "name": p.name, "memory_bytes": p.total_memory}
        if getattr(p, "pci_bus_id", None) is not None:
            d["pci"] = (getattr(p, "pci_domain_id", 0), p.pci_bus_id, getattr(p, "pci_device_id", 0))
        devices.append(d)
    r.data["devices"] = devices


def _links_section(r: Report, driver) -> None:
    import torch
    devices = r.data.get("devices", [])
    if driver.name == "host":
        r.data["links"] = {"summary": "one host: ranks share memory through memfd (no GPU links)"}
        return
    if len(devices) < 2:
        r.data["links"] = {"summary": "one GPU: no links between GPUs"}
        return
    peer = {f"{i}-{j}": torch.cuda.can_device_access_peer(i, j)
            for i in range(len(devices)) for j in range(len(devices)) if i != j}
    links = {"peer_access": peer}
    if not all(peer.values()):
        r.warn(f"some GPU pairs have no peer access ({[k for k, v in peer.items() if not v]}): a kernel there cannot "
               "reach the other GPU's heap", "check IOMMU/ACS settings and that the GPUs share a PCIe root or NVLink")
    if driver.name == "hip":
        links["summary"] = "unknown (NVML is for NVIDIA GPUs; `rocm-smi --showtopo` shows AMD links)"
    else:
        try:
            links.update(nvml_links(devices))
            kinds = sorted({p["link"] for p in links["pairs"]})
            links["summary"] = kinds[0] if len(kinds) == 1 else "mixed: see pairs"
        except ImportError:
            links["summary"] = "unknown (NVML not available: pip install nvidia-ml-py)"
        except Exception as e:  # NVML's own errors, or a driver without NVLink queries
            links["summary"] = f"unknown (NVML not available: {type(e).__name__}: {e})"
    r.data["links"] = links


# -- memory mechanism ------------------------------------------------------------
def _probe_vmm(driver) -> dict:
    """reserve, create, map, set_access one granule, export it as an fd; undo everything."""
    out = {"granularity": None, "vmm": None, "fd_export": None}
    try:
        g = out["granularity"] = driver.granularity()
        with ExitStack() as undo:
            va = driver.reserve(g)
            undo.callback(driver.free_va, va, g)
            handle = driver.create(g)
            undo.callback(driver.release, handle)
            driver.map(va, g, handle)
            undo.callback(driver.unmap, va, g)
            driver.set_access(va, g)
            out["vmm"] = "works"
            fd = driver.export(handle)
            os.close(fd)
            out["fd_export"] = "works"
    except (DriverError, OSError, ValueError) as e:
        key = "vmm" if out["vmm"] is None else "fd_export"
        out[key] = f"fails: {e}"
    return out


def _probe_ipc(driver) -> str:
    """What the torch allocator needs: an IPC handle for a torch-allocated block."""
    import torch
    try:
        if driver.name == "host":
            t = torch.empty(driver.granularity(), dtype=torch.uint8).share_memory_()
        else:
            t = torch.empty(2 << 20, dtype=torch.uint8, device="cuda")
        h = driver.ipc_export(t.data_ptr(), t.numel())
        if h.fd is not None:
            os.close(h.fd)
        return "works"
    except (DriverError, OSError, RuntimeError) as e:
        return f"fails: {e}"


def _memory_section(r: Report, driver) -> None:
    mem = _probe_vmm(driver)
    mem["torch_ipc"] = _probe_ipc(driver)
    vmem_ok = mem["vmm"] == "works" and mem["fd_export"] == "works"
    # a VMM-backed torch block (expandable segments) is shared by its handles, as vmem shares chunks
    expandable = "expandable_segments:true" in os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "").replace(" ", "").lower()
    torch_ok = mem["torch_ipc"] == "works" or (expandable and vmem_ok)
    from ..platform.nvshmem import describe as nvshmem_line
    mem["nvshmem"] = nvshmem_line()
    mem["allocators"] = {"torch": torch_ok, "vmem": vmem_ok, "nvshmem": mem["nvshmem"].startswith("usable")}
    r.data["memory"] = mem
    if not (vmem_ok or torch_ok):
        r.problem(f"no allocator can share memory here: VMM {mem['vmm']}; fd export {mem['fd_export']}; "
                  f"torch IPC {mem['torch_ipc']}",
                  "update the GPU driver; in containers allow the IPC and pidfd calls (e.g. --ipc=host, "
                  "--cap-add SYS_PTRACE)" if driver.name != "host" else "run on Linux with memfd_create and /proc")
        return
    if not vmem_ok:
        r.warn(f"allocator='vmem' cannot run here (VMM {mem['vmm']}; fd export {mem['fd_export']})",
               "use allocator='torch' (the default)")
        if settings.ALLOCATOR.get() == "vmem":
            r.problem("IRIS_ALLOCATOR=vmem but VMM does not work here", "unset IRIS_ALLOCATOR or set it to torch")
    conf = os.environ.get("PYTORCH_CUDA_ALLOC_CONF", "")
    if not torch_ok:
        why = f"IPC {mem['torch_ipc']}"
        if settings.ALLOCATOR.get() == "torch":
            r.problem(f"IRIS_ALLOCATOR=torch but the torch allocator cannot share memory here: {why}",
                      "export IRIS_ALLOCATOR=vmem")
        else:  # the code may well ask for vmem; say what the default would do
            r.warn(f"allocator='torch' (the default) cannot run here: {why}",
                   "pass allocator='vmem' to iris.iris(), or export IRIS_ALLOCATOR=vmem")
    if driver.name != "host":
        mem["as_symmetric_zero_copy"] = "expandable_segments:true" in conf.replace(" ", "").lower() and vmem_ok
        if not mem["as_symmetric_zero_copy"]:
            r.warn("as_symmetric copies torch tensors here: PyTorch's memory is not VMM-backed",
                   "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True before torch allocates, and use allocator='vmem'")


# -- libraries and environment ------------------------------------------------------
def _libraries_section(r: Report) -> None:
    r.data["libraries"] = {d: _version(d) for d in LIBRARIES}
    try:
        import triton  # noqa: F401
    except ImportError as e:
        r.problem(f"triton cannot be imported ({e})", "pip install triton (Linux x86_64/aarch64)")


def _environment_section(r: Report) -> None:
    keys = ("PYTORCH_CUDA_ALLOC_CONF", "CUDA_VISIBLE_DEVICES", "HIP_VISIBLE_DEVICES")
    r.data["environment"] = {k: os.environ[k] for k in keys if k in os.environ}
    r.data["settings"] = settings.describe()
    for row in r.data["settings"]:
        if "error" in row:
            r.problem(row["error"], f"unset {row['name']} or give it a value the message names")
    from ..allocators import ALLOCATORS
    try:
        name = settings.ALLOCATOR.get()
    except SettingError:
        name = None
    if name and name not in ALLOCATORS:
        r.problem(f"IRIS_ALLOCATOR={name!r} is not an allocator", f"set it to one of {sorted(ALLOCATORS)} or unset it")


def collect() -> dict:
    """Every fact `iris info` reports, as a JSON-ready dict; 'can_run' sums it up."""
    r = Report()
    _libraries_section(r)
    _environment_section(r)
    name = _platform_section(r)
    driver = _driver_section(r, name) if name else None
    if driver is not None:
        _devices_section(r, driver)
        _links_section(r, driver)
        _memory_section(r, driver)
        n = max(2, len(r.data.get("devices", ())))
        r.data["launch"] = f"python -m iris.run -n {n} your_script.py"
    return r.as_dict()


# -- output ------------------------------------------------------------------------
def render(info: dict) -> str:
    """The report as aligned text for a terminal."""
    lines = [f"iris {info.get('iris')} on Python {info['python']}: "
             f"{'iris can run here' if info['can_run'] else 'iris CANNOT run here'}"]

    def row(key, value):
        lines.append(f"  {key:<12} {value}")

    plat = info.get("platform") or {}
    row("platform", f"{plat.get('name') or '-'}  ({plat.get('why', '')})")
    drv = info.get("driver") or {}
    if drv:
        row("driver", drv.get("version") or f"failed: {drv.get('error')}")
    for d in info.get("devices", []):
        free = f", {_gib(d['free_bytes'])} available" if "free_bytes" in d else ""
        row("device" if d["index"] == 0 else "", f"{d['index']}: {d['name']}, {_gib(d['memory_bytes'])}{free}")
    links = info.get("links")
    if links:
        row("links", links["summary"])
        for p in links.get("pairs", []) if links["summary"].startswith("mixed") else []:
            row("", f"GPU {p['pair'][0]} <-> GPU {p['pair'][1]}: {p['link']}")
    mem = info.get("memory")
    if mem:
        row("VMM", f"{mem['vmm']}; POSIX fd export {mem['fd_export']}")
        row("granularity", _size(mem["granularity"]) if mem["granularity"] else "-")
        row("torch IPC", mem["torch_ipc"])
        row("nvshmem", mem.get("nvshmem", "-"))
        row("allocators", ", ".join(f"{k}: {'yes' if v else 'no'}" for k, v in mem["allocators"].items())
            + f" (default torch; IRIS_ALLOCATOR={settings.ALLOCATOR.get() or 'unset'})")
    libs = info.get("libraries", {})
    row("libraries", ", ".join(f"{k} {v}" for k, v in libs.items() if v))
    missing = [k for k, v in libs.items() if not v]
    if missing:
        row("", "not installed: " + ", ".join(missing))
    env = info.get("environment")
    if env:
        row("environment", " ".join(f"{k}={v}" for k, v in env.items()))
    for i, s in enumerate(info.get("settings", ())):
        value = f"{s['name']}={s['set']}" if s["set"] is not None else f"{s['name']} unset (default {s['default']})"
        row("settings" if i == 0 else "", f"{value}: {s['meaning']}")
    if "launch" in info:
        row("launch", info["launch"])
    for w in info["warnings"]:
        lines.append(f"warning: {w['warning']}" + (f"\n  fix: {w['fix']}" if w["fix"] else ""))
    for p in info["problems"]:
        lines.append(f"problem: {p['problem']}\n  fix: {p['fix']}")
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="iris info", description="Report what iris would run on here.")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    opts = parser.parse_args(argv)
    info = collect()
    print(json.dumps(info, indent=2, default=str) if opts.json else render(info))
    return 0 if info["can_run"] else 1


if __name__ == "__main__":
    sys.exit(main())
