"""The C API from Python's ctypes, as a PyTorch user would load it.

Usage: test_ctypes.py PATH/TO/libjitattn.so
Needs no GPU: checks loading, configuration, warming and error reporting
(forward and merge entry points).
"""
import ctypes
import os
import sys
import tempfile


sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
from jitattn_ctypes import BF16, F32, Options, Tensor, tensor  # noqa: E402


def bshd(address, b, s, h, d):
    return Tensor(address, 1, 4, (ctypes.c_int64 * 4)(b, s, h, d), (ctypes.c_int64 * 4)(s * h * d, h * d, d, 1))


def main():
    lib = ctypes.CDLL(sys.argv[1])
    lib.jitattn_version.restype = ctypes.c_char_p
    lib.jitattn_last_error.restype = ctypes.c_char_p
    failures = []

    checks = 0

    def check(condition, what):
        nonlocal checks
        checks += 1
        print(("ok   " if condition else "FAIL ") + what)
        if not condition:
            failures.append(what)

    check(lib.jitattn_version().decode().count(".") == 2, "version is MAJOR.MINOR.PATCH")
    with tempfile.TemporaryDirectory() as cache:
        check(lib.jitattn_configure(cache.encode(), None, 1) == 0, "configure with a cache directory")
        status = lib.jitattn_warm(b"fwd.bf16.d64.br128.bc64.w4", b"sm_80")
        check(status == 0, f"warm compiles a kernel (status {status}: {lib.jitattn_last_error().decode()})")
        q, k, out = bshd(0x1000, 1, 16, 32, 128), bshd(0x2000, 1, 16, 6, 128), bshd(0x3000, 1, 16, 32, 128)
        options = Options()
        lib.jitattn_fwd_options_init(ctypes.byref(options))
        status = lib.jitattn_fwd(ctypes.byref(q), ctypes.byref(k), ctypes.byref(k), ctypes.byref(out), None,
                                 ctypes.byref(options), None)
        message = lib.jitattn_last_error().decode()
        check(status == 1 and "heads_kv=6 must divide heads_q=32" in message, f"bad call rejected: {message}")

        status = lib.jitattn_warm(b"combine.f32.bf16", b"sm_80")
        check(status == 0, f"warm compiles a combine kernel (status {status}: {lib.jitattn_last_error().decode()})")
        states = tensor(0x4000, F32, [3, 16, 8, 128])
        lse = tensor(0x5000, BF16, [3, 16, 8])  # must be f32
        merged = tensor(0x6000, BF16, [16, 8, 128])
        status = lib.jitattn_merge_states(ctypes.byref(states), ctypes.byref(lse), ctypes.byref(merged), None, None)
        message = lib.jitattn_last_error().decode()
        check(status == 1 and "lse: dtype bf16 must be f32" in message, f"bad merge_states rejected: {message}")
        status = lib.jitattn_merge_state(ctypes.byref(merged), None, ctypes.byref(merged), None, ctypes.byref(merged),
                                         None, None)
        message = lib.jitattn_last_error().decode()
        check(status == 1 and message == "lse_a: is NULL", f"bad merge_state rejected: {message}")
    print(f"{checks - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
