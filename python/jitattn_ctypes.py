"""ctypes mirror of include/jitattn/jitattn.h, shared by the Python tests and benchmarks.

The structs must match the C header field for field. Those that grow
(options, varlen and KV-cache args) start with struct_size, which they set to
their own size: a library reads no further than that, gives the fields a
shorter mirror lacks their defaults, and refuses a mirror shorter than any
jitattn.h was.
"""
import ctypes

F16, BF16, F32, I32 = 0, 1, 2, 3


class Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 4), ("strides", ctypes.c_int64 * 4)]


class Grown(ctypes.Structure):
    """A struct of jitattn.h's that grows at its end. struct_size is set to this mirror's size; positional
    arguments fill the fields after it."""

    def __init__(self, *args, **kwargs):
        super().__init__(**kwargs)
        for (name, _), value in zip(self._fields_[1:], args):
            setattr(self, name, value)
        self.struct_size = ctypes.sizeof(self)


class Options(Grown):
    """jitattn_fwd_options. Build it with default_options(lib): a bare Options() is all zero, which is not
    jitattn_fwd_options_init's defaults (window_left = window_right = 0 is a window of the diagonal alone,
    pack_gqa = 0 turns packing off)."""
    _fields_ = [("struct_size", ctypes.c_uint32), ("softmax_scale", ctypes.c_float), ("causal", ctypes.c_int32), ("window_left", ctypes.c_int32),
                ("window_right", ctypes.c_int32), ("softcap", ctypes.c_float), ("alibi_slopes", ctypes.c_void_p),
                ("block_q", ctypes.c_int32), ("block_kv", ctypes.c_int32), ("warps", ctypes.c_int32),
                ("rope_style", ctypes.c_int32), ("rotary_dim", ctypes.c_int32), ("rope_theta", ctypes.c_float),
                ("rope_linear_scaling", ctypes.c_float), ("rope_llama3_factor", ctypes.c_float),
                ("rope_llama3_low_freq_factor", ctypes.c_float), ("rope_llama3_high_freq_factor", ctypes.c_float),
                ("rope_llama3_original_max_position", ctypes.c_int32), ("rope_cos", ctypes.c_void_p),
                ("rope_sin", ctypes.c_void_p), ("rope_q_offsets", ctypes.c_void_p),
                ("rope_k_offsets", ctypes.c_void_p), ("pack_gqa", ctypes.c_int32),
                ("stages", ctypes.c_int32), ("wgmma", ctypes.c_int32), ("persistent", ctypes.c_int32),
                ("sm_limit", ctypes.c_int32), ("num_splits", ctypes.c_int32), ("attention_chunk", ctypes.c_int32),
                ("learnable_sink", ctypes.c_void_p), ("rope_yarn_factor", ctypes.c_float),
                ("rope_yarn_beta_fast", ctypes.c_float), ("rope_yarn_beta_slow", ctypes.c_float),
                ("rope_yarn_original_max_position", ctypes.c_int32), ("rope_yarn_truncate", ctypes.c_int32),
                ("rope_yarn_attention_factor", ctypes.c_float),
                ("rope_longrope_pair_factors", ctypes.POINTER(ctypes.c_float)),
                ("rope_longrope_factor", ctypes.c_float),
                ("rope_longrope_original_max_position", ctypes.c_int32),
                ("rope_longrope_attention_factor", ctypes.c_float)]


def tensor(address, dtype, shape, strides=None):
    """A jitattn_tensor; contiguous strides when none are given."""
    if strides is None:
        strides, step = [], 1
        for size in reversed(shape):
            strides.insert(0, step)
            step *= size
    padded = list(shape) + [0] * (4 - len(shape))
    padded_strides = list(strides) + [0] * (4 - len(strides))
    return Tensor(address, dtype, len(shape), (ctypes.c_int64 * 4)(*padded), (ctypes.c_int64 * 4)(*padded_strides))


def tensor_of(t, dtype):
    """A jitattn_tensor viewing a strided array object (a torch tensor: data_ptr(), shape, stride())."""
    return tensor(t.data_ptr(), dtype, list(t.shape), list(t.stride()))


def load(path):
    """The library with every C function's signature declared, so that Python ints passed for size_t and
    pointers are converted rather than passed as 32-bit ints."""
    lib = ctypes.CDLL(path)
    p, size, status = ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int
    signatures = {
        "jitattn_fwd_options_init_sized": (None, [p, size]),
        "jitattn_fwd": (status, [p, p, p, p, p, p, p]),
        "jitattn_fwd_split": (status, [p, p, p, p, p, p, p, size, p]),
        "jitattn_fwd_workspace_bytes": (status, [p, p, p, p, p, p, p]),
        "jitattn_fwd_varlen": (status, [p, p, p, p, p, p, p, p, ctypes.c_int32, ctypes.c_int32, p, p]),
        "jitattn_fwd_varlen_split": (status, [p, p, p, p, p, p, p, p, size, p]),
        "jitattn_fwd_varlen_workspace_bytes": (status, [p, p, p, p, p, p, p, p]),
        "jitattn_fwd_kvcache": (status, [p, p, p, p, p, p, size, p]),
        "jitattn_kvcache_workspace_bytes": (status, [p, p, p, p, p, p]),
        "jitattn_merge_states": (status, [p, p, p, p, p]),
        "jitattn_merge_state": (status, [p, p, p, p, p, p, p]),
        "jitattn_warm": (status, [ctypes.c_char_p, ctypes.c_char_p]),
        "jitattn_configure": (status, [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int]),
        "jitattn_last_error": (ctypes.c_char_p, []),
        "jitattn_version": (ctypes.c_char_p, []),
    }
    for name, (restype, argtypes) in signatures.items():
        function = getattr(lib, name)
        function.restype = restype
        function.argtypes = argtypes
    return lib


def check(lib, status):
    """Raises with the library's message when a call returned an error status."""
    if status != 0:
        raise RuntimeError(lib.jitattn_last_error().decode())


def default_options(lib, options_type=None):
    """Options (or options_type, a mirror of another header's) with jitattn_fwd_options_init's defaults."""
    options = (options_type or Options)()
    lib.jitattn_fwd_options_init_sized(ctypes.byref(options), ctypes.c_size_t(ctypes.sizeof(options)))
    return options


def force_tiles(options, text):
    """Forces options' tiles from text: BQxBKVxW, BQxBKVxWxS (producer layout, S stages), or that ending in
    "w" (the producer layout with wgmma warpgroups, e.g. 128x128x8x2w) or "wp" (the same, persistent). An empty
    text leaves the planner's."""
    if not text:
        return options
    persistent = text.endswith("wp")
    wgmma = persistent or text.endswith("w")
    fields = [int(x) for x in text.rstrip("wp").split("x")]
    options.block_q, options.block_kv, options.warps = fields[:3]
    options.stages = fields[3] if len(fields) > 3 else 0
    options.wgmma = 1 if wgmma else 0
    options.persistent = 1 if persistent else 0
    return options


class KVCacheArgs(Grown):
    _fields_ = [("struct_size", ctypes.c_uint32), ("k_cache", ctypes.c_void_p), ("v_cache", ctypes.c_void_p), ("cache_seqlens", ctypes.c_void_p),
                ("block_table", ctypes.c_void_p), ("cache_batch_idx", ctypes.c_void_p), ("k_new", ctypes.c_void_p),
                ("v_new", ctypes.c_void_p), ("num_splits", ctypes.c_int32), ("max_seqlen_k", ctypes.c_int32),
                ("total_seqlen_k", ctypes.c_int64), ("dynamic_splits", ctypes.c_int32),
                ("cache_leftpad", ctypes.c_void_p)]


class VarlenArgs(Grown):
    _fields_ = [("struct_size", ctypes.c_uint32), ("cu_seqlens_q", ctypes.c_void_p), ("cu_seqlens_k", ctypes.c_void_p), ("seqused_k", ctypes.c_void_p),
                ("block_table", ctypes.c_void_p), ("max_seqlen_q", ctypes.c_int32), ("max_seqlen_k", ctypes.c_int32),
                ("total_seqlen_k", ctypes.c_int64), ("dynamic_splits", ctypes.c_int32)]
