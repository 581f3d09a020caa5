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
from jitattn_ctypes import BF16, F32, I32, KVCacheArgs, Options, Tensor, default_options, tensor  # noqa: E402


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
        options = default_options(lib)
        status = lib.jitattn_fwd(ctypes.byref(q), ctypes.byref(k), ctypes.byref(k), ctypes.byref(out), None,
                                 ctypes.byref(options), None)
        message = lib.jitattn_last_error().decode()
        check(status == 1 and "heads_kv=6 must divide heads_q=32" in message, f"bad call rejected: {message}")

        # The YaRN and LongRoPE fields at the struct's end: init's defaults
        # read back where Options puts them, and each field reaches the
        # library under its own name (a layout that disagreed with jitattn.h
        # would misplace them). LongRoPE's pair factors are a host array the
        # library reads during the call.
        def planned(base, field=None, value=None):
            """jitattn_fwd_workspace_bytes's status and message for options set by base, then field = value."""
            options = default_options(lib)
            options.rope_style = 1
            base(options)
            if field is not None:
                setattr(options, field, value)
            size = ctypes.c_size_t(0)
            status = lib.jitattn_fwd_workspace_bytes(ctypes.byref(q), ctypes.byref(k), ctypes.byref(k),
                                                     ctypes.byref(out), None, ctypes.byref(options),
                                                     ctypes.byref(size))
            return status, lib.jitattn_last_error().decode()

        def yarn(options):  # gpt-oss's
            options.rope_theta = 150000.0
            options.rope_yarn_factor = 32.0
            options.rope_yarn_truncate = 0

        factors = (ctypes.c_float * 32)(*[1.0 + p for p in range(32)])
        spoiled = (ctypes.c_float * 32)(*[1.0 + p for p in range(32)])
        spoiled[3] = float("nan")

        def longrope(options):
            options.rope_longrope_pair_factors = factors
            options.rope_longrope_factor = 32.0

        options = default_options(lib)
        defaults = (options.rope_yarn_factor, options.rope_yarn_beta_fast, options.rope_yarn_beta_slow,
                    options.rope_yarn_original_max_position, options.rope_yarn_truncate,
                    options.rope_yarn_attention_factor)
        check(defaults == (0.0, 32.0, 1.0, 4096, 1, 0.0), f"init sets the YaRN defaults: {defaults}")
        defaults = (bool(options.rope_longrope_pair_factors), options.rope_longrope_factor,
                    options.rope_longrope_original_max_position, options.rope_longrope_attention_factor)
        check(defaults == (False, 0.0, 4096, 0.0), f"init sets the LongRoPE defaults: {defaults}")
        q, k, out = bshd(0x1000, 1, 16, 64, 64), bshd(0x2000, 1, 16, 8, 64), bshd(0x3000, 1, 16, 64, 64)
        for base in (yarn, longrope):
            status, message = planned(base)
            check(status == 0, f"{base.__name__} options accepted (status {status}: {message})")
        for base, field, value, expected in [
                (yarn, "rope_yarn_factor", -2.0, "options.rope.yarn_factor=-2 must be positive"),
                (yarn, "rope_yarn_beta_fast", 0.5, "yarn_beta_fast=0.5 and yarn_beta_slow=1"),
                (yarn, "rope_yarn_beta_slow", 40.0, "yarn_beta_fast=32 and yarn_beta_slow=40"),
                (yarn, "rope_yarn_original_max_position", 0, "options.rope.yarn_original_max_position=0 must be positive"),
                (yarn, "rope_yarn_attention_factor", -1.0, "options.rope.yarn_attention_factor=-1 must be"),
                (longrope, "rope_longrope_pair_factors", spoiled,
                 "options.rope.longrope_pair_factors[3]=nan must be positive"),
                (longrope, "rope_longrope_factor", -2.0, "options.rope.longrope_factor=-2 must be"),
                (longrope, "rope_longrope_original_max_position", 1,
                 "options.rope.longrope_original_max_position=1 must be above 1"),
                (longrope, "rope_longrope_attention_factor", -1.0, "options.rope.longrope_attention_factor=-1 must be")]:
            status, message = planned(base, field, value)
            check(status == 1 and expected in message, f"bad {field} rejected: {message}")

        # struct_size: the mirror's own size, so a mirror that disagrees with the library's header is read only
        # as far as it goes, and one shorter than any jitattn.h (a field left out) is refused by name.
        check(default_options(lib).struct_size == ctypes.sizeof(Options), "Options carry their size")

        class ShortOptions(Options.__base__):
            _fields_ = Options._fields_[:-1]

        short = default_options(lib, ShortOptions)
        size = ctypes.c_size_t(0)
        status = lib.jitattn_fwd_workspace_bytes(ctypes.byref(q), ctypes.byref(k), ctypes.byref(k), ctypes.byref(out),
                                                 None, ctypes.byref(short), ctypes.byref(size))
        message = lib.jitattn_last_error().decode()
        check(status == 1 and f"options.struct_size={ctypes.sizeof(ShortOptions)} is not the size of any "
              "jitattn_fwd_options" in message, f"a mirror missing a field refused: {message}")
        cache, lengths = bshd(0x7000, 1, 4096, 8, 64), tensor(0x8000, I32, [1])
        kv_args = KVCacheArgs(ctypes.addressof(cache), ctypes.addressof(cache), ctypes.addressof(lengths))
        check(kv_args.struct_size == ctypes.sizeof(KVCacheArgs) and kv_args.cache_seqlens == ctypes.addressof(lengths),
              "positional KVCacheArgs fill the fields after struct_size")
        options = default_options(lib)
        status = lib.jitattn_kvcache_workspace_bytes(ctypes.byref(q), ctypes.byref(kv_args), ctypes.byref(out), None,
                                                     ctypes.byref(options), ctypes.byref(size))
        check(status == 0, f"a KV-cache call planned through the mirror ({lib.jitattn_last_error().decode()})")
        kv_args.struct_size = 0
        status = lib.jitattn_kvcache_workspace_bytes(ctypes.byref(q), ctypes.byref(kv_args), ctypes.byref(out), None,
                                                     ctypes.byref(options), ctypes.byref(size))
        message = lib.jitattn_last_error().decode()
        check(status == 1 and "args.struct_size is 0" in message, f"args never initialized refused: {message}")

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
