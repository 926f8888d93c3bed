"""How each pair of NVIDIA GPUs is linked (NVLink, through an NVSwitch or not, or the PCIe path), from NVML.

Needs the `pynvml` module (pip install nvidia-ml-py); the caller reports "unknown" without it.
NVML numbers GPUs its own way, so devices are matched to CUDA's ordinals by PCI address.
"""
from __future__ import annotations

_NVLINK_VERSIONS = {1: "1.0", 2: "2.0", 3: "2.2", 4: "3.0", 5: "3.1", 6: "4.0", 7: "5.0", 8: "6.0"}  # nvmlNvlinkVersion_t
_TOPOLOGY = {0: "same board", 10: "PCIe, one switch", 20: "PCIe, several switches", 30: "PCIe, through a host bridge",
             40: "PCIe, across host bridges of one NUMA node", 50: "PCIe and the CPU interconnect, across NUMA nodes"}


def nvml_links(devices) -> dict:
    """Per pair of CUDA devices: NVLink (and how many links) or the PCIe path, from NVML."""
    import pynvml as nv
    nv.nvmlInit()
    try:
        handles = []
        for d in devices:  # match NVML's numbering to CUDA's by PCI address; fall back to the index
            h = None
            if "pci" in d:
                dom, bus, dev = d["pci"]
                try:
                    h = nv.nvmlDeviceGetHandleByPciBusId(f"{dom:08x}:{bus:02x}:{dev:02x}.0")
                except nv.NVMLError:
                    h = None
            handles.append(h or nv.nvmlDeviceGetHandleByIndex(d["index"]))
        bus_of = [_bus(nv.nvmlDeviceGetPciInfo(h).busId) for h in handles]
        active = [_nvlinks(nv, h) for h in handles]
        pairs = []
        for i in range(len(handles)):
            for j in range(i + 1, len(handles)):
                pairs.append({"pair": [i, j], "link": _pair_link(nv, handles, active, bus_of, i, j)})
        return {"source": "NVML", "driver": _text(nv.nvmlSystemGetDriverVersion()), "pairs": pairs}
    finally:
        nv.nvmlShutdown()


def _nvlinks(nv, h):
    """(enabled links, NVLink version, remote bus ids, any link to an NVSwitch) of one GPU."""
    links, version, remote, switch = 0, None, [], False
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        try:
            if nv.nvmlDeviceGetNvLinkState(h, link) != nv.NVML_FEATURE_ENABLED:
                continue
        except nv.NVMLError:
            continue
        links += 1
        for query in ("version", "remote", "type"):  # each may be unsupported on its own
            try:
                if query == "version" and version is None:
                    version = _NVLINK_VERSIONS.get(nv.nvmlDeviceGetNvLinkVersion(h, link))
                elif query == "remote":
                    remote.append(_bus(nv.nvmlDeviceGetNvLinkRemotePciInfo(h, link).busId))
                elif query == "type" and hasattr(nv, "nvmlDeviceGetNvLinkRemoteDeviceType"):
                    switch |= nv.nvmlDeviceGetNvLinkRemoteDeviceType(h, link) == nv.NVML_NVLINK_DEVICE_TYPE_SWITCH
            except nv.NVMLError:
                pass
    return links, version, remote, switch


def _text(v) -> str:
    return v.decode() if isinstance(v, bytes) else str(v)


def _bus(v) -> str:
    """NVML bus ids come as 00000000:18:00.0 or 0000:18:00.0; compare without the domain's width."""
    dom, rest = _text(v).lower().split(":", 1)
    return f"{int(dom, 16):x}:{rest}"


def _pair_link(nv, handles, active, bus_of, i, j) -> str:
    direct = active[i][2].count(bus_of[j])
    links, version = active[i][0], active[i][1]
    try:
        nvlink_p2p = nv.nvmlDeviceGetP2PStatus(handles[i], handles[j], nv.NVML_P2P_CAPS_INDEX_NVLINK) == \
            nv.NVML_P2P_STATUS_OK
    except nv.NVMLError:
        nvlink_p2p = False
    gen = f" {version}" if version else ""
    if direct:
        return f"NVLink{gen}, {direct} direct link(s) (NV{direct})"
    if nvlink_p2p or (links and active[j][0]):
        via = " through NVSwitch" if active[i][3] else ""
        return f"NVLink{gen}{via}, {links} active link(s) per GPU (NV{links})"
    try:
        level = nv.nvmlDeviceGetTopologyCommonAncestor(handles[i], handles[j])
        return _TOPOLOGY.get(level, f"PCIe (NVML topology level {level})")
    except nv.NVMLError as e:
        return f"PCIe (path unknown: {e})"
