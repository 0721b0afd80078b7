"""
make_h5py_types.py -- writes tests/data/h5py_types.h5: the dtypes and string kinds h5py produces,
so the C++ HDF5 layer is tested against h5py's own output without running Python in the tests.

Usage: /usr/bin/python3 tests/data/make_h5py_types.py tests/data/h5py_types.h5
"""
import sys

import h5py
import numpy as np


def main():
    out = sys.argv[1] if len(sys.argv) > 1 else "h5py_types.h5"
    with h5py.File(out, "w") as f:
        f.create_dataset("i64", data=np.array([[0, -1, 2], [3, 2**31 - 1, -2**31]], dtype=np.int64))
        f.create_dataset("i16", data=np.array([-32768, 0, 7, 32767], dtype=np.int16))
        f.create_dataset("u16", data=np.array([0, 1, 65535], dtype=np.uint16))
        f.create_dataset("u8", data=np.arange(0, 256, 51, dtype=np.uint8))
        f.create_dataset("i64_big", data=np.array([1, 2**40], dtype=np.int64))
        f.create_dataset("u64_big", data=np.array([2**63 + 5], dtype=np.uint64))
        f.create_dataset("f64", data=np.array([[0.5, -2.0], [0.1, 1e300]], dtype=np.float64))
        f.create_dataset("f32_scalar", data=np.float32(3.25))
        f.create_dataset("strings", data=["a", "bc"])
        f.create_dataset("flags", data=np.array([True, False]))
        f.create_dataset("chunked", data=np.arange(12, dtype=np.float32).reshape(3, 4), chunks=(1, 4),
                         compression="gzip")
        f.create_group("g/sub").create_dataset("x", data=np.zeros(2, np.float32))
        f["g"].create_dataset("y.z", data=np.zeros(1, np.float32))
        f["link"] = h5py.SoftLink("/g/sub/x")
        f.attrs["vlen_str"] = "h\u00e9llo {\"k\": 1}"
        f.attrs["empty_str"] = ""
        f.attrs["fixed_str"] = np.bytes_(b"fixed")
        f.attrs["i8"] = np.int8(-5)
        f.attrs["u64"] = np.uint64(2**63 + 1)
        f.attrs["i64"] = -(2**40)
        f.attrs["f32"] = np.float32(0.25)
        f.attrs["f64"] = 1.0 / 3.0
        f.attrs["bool"] = True
        f.attrs["array"] = np.array([1, 2, 3])
        f["g"].attrs["note"] = "on a group"
        f["i64"].attrs["note"] = "on a dataset"


if __name__ == "__main__":
    main()
