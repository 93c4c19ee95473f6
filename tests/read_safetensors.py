#!/usr/bin/env python3
"""A plain safetensors reader (header JSON, dtypes, shapes, values) with no dependencies, used by
the tests to show that files written by xloco load in Python. Prints one JSON summary."""
import json
import struct
import sys

FORMATS = {"F32": "f", "F64": "d", "I64": "q", "I32": "i", "U8": "B"}


def read(path):
    with open(path, "rb") as f:
        raw = f.read()
    (n,) = struct.unpack("<Q", raw[:8])
    header = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    out = {"metadata": header.pop("__metadata__", {}), "tensors": {}}
    for name, info in header.items():
        begin, end = info["data_offsets"]
        fmt = FORMATS[info["dtype"]]
        count = (end - begin) // struct.calcsize(fmt)
        values = struct.unpack("<%d%s" % (count, fmt), data[begin:end])
        numel = 1
        for d in info["shape"]:
            numel *= d
        assert numel == count, (name, numel, count)
        out["tensors"][name] = {"dtype": info["dtype"], "shape": info["shape"],
                                "sum": float(sum(values)), "first": values[:3]}
    return out


if __name__ == "__main__":
    print(json.dumps(read(sys.argv[1])))
