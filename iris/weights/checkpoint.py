"""The safetensors format, read without safetensors: which files a checkpoint is, and where each
tensor's bytes lie in them. Nothing is allocated and no tensor data is read here.

A file is an 8-byte little-endian header length N, N bytes of JSON (name -> dtype, shape,
data_offsets [begin, end) relative to the end of the header; an optional "__metadata__"), then
the data, each tensor row-major and packed.
"""
from __future__ import annotations

import glob
import json
import os
import struct
from dataclasses import dataclass
from typing import Dict, List, Sequence, Tuple, Union

import torch

from ..errors import CheckpointError

# safetensors dtype names -> torch dtypes, for those this torch has (uint16..64 and the float8s
# are recent); F4 (two values per byte) has no element-per-shape-entry layout and is left out
_DTYPES = {name: getattr(torch, attr) for name, attr in (
    ("BOOL", "bool"), ("U8", "uint8"), ("I8", "int8"), ("I16", "int16"), ("U16", "uint16"), ("I32", "int32"),
    ("U32", "uint32"), ("I64", "int64"), ("U64", "uint64"), ("F16", "float16"), ("BF16", "bfloat16"),
    ("F32", "float32"), ("F64", "float64"), ("C64", "complex64"), ("F8_E4M3", "float8_e4m3fn"),
    ("F8_E5M2", "float8_e5m2"), ("F8_E4M3FNUZ", "float8_e4m3fnuz"), ("F8_E5M2FNUZ", "float8_e5m2fnuz"),
    ("F8_E8M0", "float8_e8m0fnu")) if hasattr(torch, attr)}

_MAX_HEADER = 100 << 20  # safetensors' own limit on the JSON header


@dataclass(frozen=True)
class Entry:
    """Where one tensor's bytes are: file index into the checkpoint's files, absolute byte offset."""
    name: str
    file: int
    dtype: torch.dtype
    shape: Tuple[int, ...]
    offset: int

    @property
    def nbytes(self) -> int:
        return torch.Size(self.shape).numel() * self.dtype.itemsize


def checkpoint_files(path: Union[str, os.PathLike, Sequence]) -> List[str]:
    """The files of a checkpoint: one file, a list of files, or a directory of shards (the files
    its *.safetensors.index.json names, else every *.safetensors in it, sorted)."""
    if isinstance(path, (list, tuple)):
        if not path:
            raise ValueError("load_safetensors: an empty list of files; pass at least one .safetensors file")
        files = [os.fspath(p) for p in path]
    elif os.path.isdir(path):
        index = sorted(glob.glob(os.path.join(path, "*.safetensors.index.json")))
        if index:
            with open(index[0]) as f:
                weight_map = json.load(f).get("weight_map", {})
            files = [os.path.join(path, name) for name in sorted(set(weight_map.values()))]
        else:
            files = sorted(glob.glob(os.path.join(path, "*.safetensors")))
        if not files:
            raise CheckpointError(f"{path} is a directory with no *.safetensors files (and no index naming them)")
    else:
        files = [os.fspath(path)]
    for f in files:
        if not os.path.isfile(f):
            raise FileNotFoundError(f"checkpoint file {f} does not exist (or is not a regular file)")
    if len(set(map(os.path.realpath, files))) != len(files):
        raise ValueError(f"load_safetensors: a file is listed twice in {files}")
    return files


def read_header(path: str, file: int = 0) -> Dict[str, Entry]:
    """name -> Entry for every tensor of one file, checked against the file's size."""
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise CheckpointError(f"{path}: {size} bytes is too short for a safetensors file (no 8-byte header length)")
        (n,) = struct.unpack("<Q", head)
        if n > _MAX_HEADER or 8 + n > size:
            raise CheckpointError(f"{path}: header length {n} does not fit the file's {size} bytes: "
                                  "not a safetensors file, or truncated")
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise CheckpointError(f"{path}: the header is not valid JSON ({e}): not a safetensors file") from None
    if not isinstance(header, dict):
        raise CheckpointError(f"{path}: the header is not a JSON object")
    out, data = {}, 8 + n
    for name, info in header.items():
        if name == "__metadata__":
            continue
        try:
            dtype, shape, (begin, end) = info["dtype"], tuple(info["shape"]), info["data_offsets"]
        except (KeyError, TypeError, ValueError):
            raise CheckpointError(f"{path}: tensor {name!r} has a malformed entry {info!r}") from None
        if dtype not in _DTYPES:
            raise CheckpointError(f"{path}: tensor {name!r} has dtype {dtype}, which this torch ({torch.__version__}) "
                                  f"cannot hold; supported: {sorted(_DTYPES)}")
        if any(not isinstance(s, int) or s < 0 for s in shape):
            raise CheckpointError(f"{path}: tensor {name!r} has a bad shape {list(shape)}")
        entry = Entry(name, file, _DTYPES[dtype], shape, data + begin)
        if end - begin != entry.nbytes:
            raise CheckpointError(f"{path}: tensor {name!r} ({dtype}, shape {list(shape)}) needs {entry.nbytes} bytes "
                                  f"but its data_offsets span {end - begin}")
        if data + end > size:
            raise CheckpointError(f"{path}: tensor {name!r} ends at byte {data + end} but the file has {size} bytes: "
                                  "the file is truncated; copy or download it again")
        out[name] = entry
    return out


def read_entries(files: Sequence[str]) -> Dict[str, Entry]:
    """name -> Entry over all files; a name in two files is an error."""
    out: Dict[str, Entry] = {}
    for i, path in enumerate(files):
        for name, entry in read_header(path, i).items():
            if name in out:
                raise CheckpointError(f"tensor {name!r} is in both {files[out[name].file]} and {path}")
            out[name] = entry
    return out
