"""_capi.py - the ctypes binding of include/dsa.h that the torch ops (ops.py) and the peer benchmark
(bench/cudnn_peer.py) call. It imports nothing but the standard library.

The structs mirror dsa.h field by field (int64_t -> c_int64, int32_t -> c_int32, float -> c_float,
enums -> c_int, every pointer -> c_void_p), so a field added to a struct in dsa.h must be added here
in the same place. Pointers are plain integers: torch's tensor.data_ptr() on the GPU, numpy's
array.ctypes.data for the dsa_ref_* CPU references.

    python3 python/libdsa/_capi.py [--lib build/libdsa.so]

runs the CPU self-test: the struct sizes against the ones gcc printed for dsa.h, then dsa_ref_topk,
dsa_ref_indexer_topk (through a host plan), dsa_ref_sparse_attn_fwd and dsa_ref_sparse_attn_bwd on
tiny numpy inputs, each checked against a numpy version of the same math (needs numpy; runs without a GPU).
"""
import ctypes as C
import sys

P = C.c_void_p
I64 = C.c_int64
I32 = C.c_int32

DSA_SUCCESS = 0
DSA_ERROR_INVALID_ARGUMENT = 1
DSA_ERROR_UNSUPPORTED = 2
DSA_ERROR_NO_DEVICE = 6
DSA_DTYPE_F32 = 0
DSA_DTYPE_BF16 = 1
DSA_INDEXER_ENGINE_DEFAULT = 0
DSA_INDEXER_ENGINE_CUBLAS = 1
DSA_INDEXER_ENGINE_FUSED = 2

# dsa_tune.h's options (ids pinned): name -> id
OPTIONS = {"fwd_kernel": 1, "fwd_sm90_handoff": 2, "fwd_kv_l2_hint": 3, "fwd_small_auto_max": 4,
           "bwd_kernel": 5, "bwd_det_chunk_tokens": 6, "topk_kernel": 7, "topk_compact_long_rows": 8,
           "indexer_fused_kernel": 9, "indexer_scores_budget": 10, "indexer_logits_budget": 11,
           "indexer_key_tile": 12, "train_kernel": 13}


class PlanDesc(C.Structure):
    _fields_ = [("cu_seqlens", P), ("cu_seqlens_padded", P), ("num_seqs", I64),
                ("total_key_tokens", I64), ("query_start", I64), ("num_queries", I64),
                ("padding_mask", P), ("max_seqlen", I64)]


class PlanView(C.Structure):
    _fields_ = [("num_queries", I64), ("total_key_tokens", I64), ("query_start", I64),
                ("num_segments", I64), ("num_valid", I64), ("num_key_sources", I64),
                ("max_seqlen_q", I32), ("max_seqlen_k", I32), ("all_rows_nonempty", I32),
                ("reserved_", I32), ("starts", P), ("causal_lengths", P), ("query_valid", P),
                ("valid_row_indices", P), ("segment_cu_q", P), ("segment_cu_k", P),
                ("q_causal_offsets", P), ("key_source_indices", P)]


class CompactParams(C.Structure):
    _fields_ = [("rows", I64), ("k", I32), ("key_count", I64), ("indices", P), ("indices_stride", I64),
                ("out", P), ("out_stride", I64), ("lengths", P)]


class PadHeadsParams(C.Structure):
    _fields_ = [("num_tokens", I64), ("num_heads", I32), ("padded_heads", I32), ("head_dim", I32),
                ("q", P), ("q_stride_token", I64), ("q_stride_head", I64), ("q_out", P), ("sink", P),
                ("sink_out", P)]


class SlotTargetParams(C.Structure):
    _fields_ = [("num_tokens", I64), ("num_heads", I32), ("head_dim", I32), ("num_kv", I64), ("topk", I32),
                ("softmax_scale", C.c_float), ("q", P), ("q_stride_token", I64), ("q_stride_head", I64),
                ("kv", P), ("kv_stride", I64), ("indices", P), ("indices_stride", I64), ("topk_length", P),
                ("sink", P), ("lse", P), ("target", P), ("target_stride", I64)]


class IndexerSlotScoresParams(C.Structure):
    _fields_ = [("num_tokens", I64), ("num_keys", I64), ("num_heads", I32), ("topk", I32), ("index_q", P),
                ("q_stride_token", I64), ("q_stride_head", I64), ("index_k", P), ("k_stride", I64),
                ("weights", P), ("weights_dtype", C.c_int), ("weights_stride", I64), ("indices", P),
                ("indices_stride", I64), ("lengths", P), ("scores", P), ("scores_stride", I64)]


class IndexerLossParams(C.Structure):
    _fields_ = [("num_tokens", I64), ("topk", I32), ("num_keys", I64), ("indices", P), ("indices_stride", I64),
                ("lengths", P), ("target", P), ("target_stride", I64), ("scores", P), ("scores_stride", I64),
                ("coeff", C.c_float), ("grad_loss", P), ("loss", P), ("grad", P), ("grad_stride", I64)]


class IndexerBwdParams(C.Structure):
    _fields_ = [("num_tokens", I64), ("num_keys", I64), ("num_heads", I32), ("topk", I32),
                ("deterministic", I32), ("index_q", P), ("q_stride_token", I64), ("q_stride_head", I64),
                ("index_k", P), ("k_stride", I64), ("weights", P), ("weights_dtype", C.c_int),
                ("weights_stride", I64), ("indices", P), ("indices_stride", I64), ("lengths", P),
                ("grad", P), ("grad_stride", I64), ("d_index_q", P), ("dq_stride_token", I64),
                ("dq_stride_head", I64), ("d_weights", P), ("dw_stride", I64), ("d_index_k", P),
                ("dk_stride", I64)]


class TopkParams(C.Structure):
    _fields_ = [("rows", I64), ("columns", I64), ("k", I32), ("scores", P), ("scores_stride", I64),
                ("lengths", P), ("indices", P), ("indices_stride", I64)]


class IndexerParams(C.Structure):
    _fields_ = [("plan", P), ("num_heads", I32), ("topk", I32), ("index_q", P),
                ("q_stride_token", I64), ("q_stride_head", I64), ("index_k", P), ("k_stride", I64),
                ("weights", P), ("weights_dtype", C.c_int), ("weights_stride", I64),
                ("indices", P), ("indices_stride", I64), ("lengths", P), ("engine", C.c_int)]


class AttnFwdParams(C.Structure):
    _fields_ = [("num_tokens", I64), ("num_heads", I32), ("head_dim", I32), ("num_kv", I64),
                ("topk", I32), ("softmax_scale", C.c_float), ("q", P), ("q_stride_token", I64),
                ("q_stride_head", I64), ("kv", P), ("kv_stride", I64), ("indices", P),
                ("indices_stride", I64), ("topk_length", P), ("sink", P), ("out", P),
                ("out_stride_token", I64), ("out_stride_head", I64), ("lse", P), ("max_logits", P)]


class AttnBwdParams(C.Structure):
    _fields_ = [("num_tokens", I64), ("num_heads", I32), ("head_dim", I32), ("num_kv", I64),
                ("topk", I32), ("softmax_scale", C.c_float), ("deterministic", I32), ("q", P),
                ("q_stride_token", I64), ("q_stride_head", I64), ("kv", P), ("kv_stride", I64),
                ("indices", P), ("indices_stride", I64), ("topk_length", P), ("sink", P),
                ("out", P), ("out_stride_token", I64), ("out_stride_head", I64), ("dout", P),
                ("dout_stride_token", I64), ("dout_stride_head", I64), ("lse", P), ("dq", P),
                ("dq_stride_token", I64), ("dq_stride_head", I64), ("dkv", P), ("dkv_stride", I64),
                ("dsink", P), ("slot_target", P), ("slot_target_stride", I64)]


# sizeof of each struct as gcc -Iinclude printed it for dsa.h on x86-64 (with every offset equal
# to ctypes' own); a mismatch means dsa.h changed and the binding above must follow it.
EXPECTED_SIZES = {PlanDesc: 64, PlanView: 128, CompactParams: 64, PadHeadsParams: 72, TopkParams: 64,
                  IndexerParams: 112, AttnFwdParams: 144, AttnBwdParams: 232, SlotTargetParams: 128,
                  IndexerSlotScoresParams: 128, IndexerLossParams: 120, IndexerBwdParams: 192}


class DSAError(RuntimeError):
    """A libdsa call failed; the text is libdsa's status and message (which names the argument)."""

    def __init__(self, message, status):
        super().__init__(message)
        self.status = status


class DSAInvalidArgument(DSAError, ValueError):
    """DSA_ERROR_INVALID_ARGUMENT: also a ValueError."""


class DSAUnsupported(DSAError):
    """DSA_ERROR_UNSUPPORTED or DSA_ERROR_NO_DEVICE."""


class Lib:
    """libdsa loaded with ctypes; each call raises DSAError with libdsa's message on failure."""

    def __init__(self, path):
        self.so = so = C.CDLL(path)
        so.dsa_version_string.restype = C.c_char_p
        so.dsa_status_string.restype = C.c_char_p
        so.dsa_status_string.argtypes = [C.c_int]
        so.dsa_last_error_message.restype = C.c_char_p
        so.dsa_context_create.argtypes = [C.POINTER(P), C.c_int]
        so.dsa_context_destroy.argtypes = [P]
        so.dsa_context_destroy.restype = None
        so.dsa_plan_create.argtypes = [C.POINTER(PlanDesc), C.POINTER(P)]
        so.dsa_plan_destroy.argtypes = [P]
        so.dsa_plan_destroy.restype = None
        so.dsa_plan_host_view.argtypes = [P]
        so.dsa_plan_host_view.restype = C.POINTER(PlanView)
        so.dsa_plan_upload.argtypes = [P, P, P, C.POINTER(C.c_size_t), C.POINTER(PlanView), P]
        so.dsa_topk.argtypes = [P, C.POINTER(TopkParams), P, C.POINTER(C.c_size_t), P]
        so.dsa_indexer_topk.argtypes = [P, C.POINTER(IndexerParams), P, C.POINTER(C.c_size_t), P]
        so.dsa_sparse_attn_fwd.argtypes = [P, C.POINTER(AttnFwdParams), P]
        so.dsa_sparse_attn_bwd.argtypes = [P, C.POINTER(AttnBwdParams), P, C.POINTER(C.c_size_t), P]
        so.dsa_compact_indices.argtypes = [P, C.POINTER(CompactParams), P]
        so.dsa_pad_heads.argtypes = [P, C.POINTER(PadHeadsParams), P]
        so.dsa_ref_compact_indices.argtypes = [C.POINTER(CompactParams)]
        so.dsa_ref_pad_heads.argtypes = [C.POINTER(PadHeadsParams)]
        so.dsa_padded_head_count.argtypes = [C.c_int]
        so.dsa_padded_head_count.restype = C.c_int
        so.dsa_context_set_option.argtypes = [P, C.c_int, I64]
        so.dsa_context_get_option.argtypes = [P, C.c_int, C.POINTER(I64)]
        so.dsa_attn_slot_target.argtypes = [P, C.POINTER(SlotTargetParams), P]
        so.dsa_ref_attn_slot_target.argtypes = [C.POINTER(SlotTargetParams)]
        so.dsa_indexer_slot_scores.argtypes = [P, C.POINTER(IndexerSlotScoresParams), P]
        so.dsa_ref_indexer_slot_scores.argtypes = [C.POINTER(IndexerSlotScoresParams)]
        so.dsa_indexer_loss.argtypes = [P, C.POINTER(IndexerLossParams), P, C.POINTER(C.c_size_t), P]
        so.dsa_ref_indexer_loss.argtypes = [C.POINTER(IndexerLossParams)]
        so.dsa_indexer_bwd.argtypes = [P, C.POINTER(IndexerBwdParams), P, C.POINTER(C.c_size_t), P]
        so.dsa_ref_indexer_bwd.argtypes = [C.POINTER(IndexerBwdParams)]
        so.dsa_ref_topk.argtypes = [C.POINTER(TopkParams)]
        so.dsa_ref_indexer_topk.argtypes = [C.POINTER(IndexerParams)]
        so.dsa_ref_sparse_attn_fwd.argtypes = [C.POINTER(AttnFwdParams)]
        so.dsa_ref_sparse_attn_bwd.argtypes = [C.POINTER(AttnBwdParams)]
        for f in (so.dsa_context_create, so.dsa_plan_create, so.dsa_plan_upload, so.dsa_topk,
                  so.dsa_compact_indices, so.dsa_pad_heads, so.dsa_context_set_option,
                  so.dsa_context_get_option, so.dsa_attn_slot_target, so.dsa_ref_attn_slot_target,
                  so.dsa_indexer_slot_scores, so.dsa_ref_indexer_slot_scores, so.dsa_indexer_loss,
                  so.dsa_ref_indexer_loss, so.dsa_indexer_bwd, so.dsa_ref_indexer_bwd, so.dsa_ref_compact_indices, so.dsa_ref_pad_heads,
                  so.dsa_indexer_topk, so.dsa_sparse_attn_fwd, so.dsa_sparse_attn_bwd,
                  so.dsa_ref_topk, so.dsa_ref_indexer_topk, so.dsa_ref_sparse_attn_fwd,
                  so.dsa_ref_sparse_attn_bwd):
            f.restype = C.c_int
        self.version = so.dsa_version_string().decode()

    def check(self, status, what):
        if status != DSA_SUCCESS:
            text = self.so.dsa_status_string(status).decode()
            msg = self.so.dsa_last_error_message().decode()
            cls = (DSAInvalidArgument if status == DSA_ERROR_INVALID_ARGUMENT
                   else DSAUnsupported if status in (DSA_ERROR_UNSUPPORTED, DSA_ERROR_NO_DEVICE)
                   else DSAError)
            # libdsa's message names the function already: say it once
            named = msg.startswith(what.split(" ")[0] + ":")
            raise cls(f"{text}: {msg}" if named else f"{what}: {text}: {msg}", status)

    # ---- GPU side ----
    def context_create(self, device=0):
        ctx = P()
        self.check(self.so.dsa_context_create(C.byref(ctx), device), "dsa_context_create")
        return ctx

    def plan_create(self, desc):
        plan = P()
        self.check(self.so.dsa_plan_create(C.byref(desc), C.byref(plan)), "dsa_plan_create")
        return plan

    def plan_upload_size(self, ctx, plan, stream):
        n = C.c_size_t(0)
        view = PlanView()
        self.check(self.so.dsa_plan_upload(ctx, plan, None, C.byref(n), C.byref(view), stream),
                   "dsa_plan_upload (size)")
        return n.value

    def plan_upload(self, ctx, plan, buf_ptr, nbytes, stream):
        n = C.c_size_t(nbytes)
        view = PlanView()
        self.check(self.so.dsa_plan_upload(ctx, plan, buf_ptr, C.byref(n), C.byref(view), stream),
                   "dsa_plan_upload")
        return view

    # Two-phase ops: ws_size() with workspace NULL, then the call itself.
    def topk_ws(self, ctx, p, stream):
        n = C.c_size_t(0)
        self.check(self.so.dsa_topk(ctx, C.byref(p), None, C.byref(n), stream), "dsa_topk (size)")
        return n.value

    def indexer_ws(self, ctx, p, stream):
        n = C.c_size_t(0)
        self.check(self.so.dsa_indexer_topk(ctx, C.byref(p), None, C.byref(n), stream),
                   "dsa_indexer_topk (size)")
        return n.value

    def bwd_ws(self, ctx, p, stream):
        n = C.c_size_t(0)
        self.check(self.so.dsa_sparse_attn_bwd(ctx, C.byref(p), None, C.byref(n), stream),
                   "dsa_sparse_attn_bwd (size)")
        return n.value


def _self_test(path):
    import numpy as np

    lib = Lib(path)
    print(f"libdsa {lib.version} from {path}")
    for cls, size in EXPECTED_SIZES.items():
        assert C.sizeof(cls) == size, f"sizeof {cls.__name__}: ctypes {C.sizeof(cls)}, dsa.h {size}"
    print("struct sizes match dsa.h (x86-64 gcc)")
    rng = np.random.default_rng(1)
    ptr = lambda a: a.ctypes.data if a is not None else None

    def bf16(x):  # fp32 -> bf16 bits, round to nearest even (finite inputs)
        u = np.ascontiguousarray(x, np.float32).view(np.uint32).astype(np.uint64)
        return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)

    def f32(b):
        return (b.astype(np.uint32) << 16).view(np.float32).astype(np.float64)

    # ---- top-k: 4 rows x 300 columns, K = 17, lengths (one shorter than K) ----
    rows, cols, K = 4, 300, 17
    scores = rng.uniform(-1, 1, (rows, cols)).astype(np.float32)
    lengths = np.array([300, 10, 150, 17], np.int32)
    idx = np.full((rows, K), -7, np.int32)
    tp = TopkParams(rows=rows, columns=cols, k=K, scores=ptr(scores), lengths=ptr(lengths),
                    indices=ptr(idx))
    lib.check(lib.so.dsa_ref_topk(C.byref(tp)), "dsa_ref_topk")
    for r in range(rows):
        L = lengths[r]
        want = np.sort(np.argsort(-scores[r, :L], kind="stable")[:K])
        want = np.concatenate([want, np.full(K - len(want), -1)])
        assert (idx[r] == want).all(), f"dsa_ref_topk row {r}: {idx[r]} vs {want}"
    print("dsa_ref_topk ok")

    # ---- indexer through a host plan: one causal sequence of 40 keys, the last 12 queries ----
    Tk, Tq, H, K = 40, 12, 4, 8
    cu = np.array([0, Tk], np.int32)
    desc = PlanDesc(cu_seqlens=ptr(cu), num_seqs=1, total_key_tokens=Tk, query_start=Tk - Tq,
                    num_queries=Tq)
    plan = lib.plan_create(desc)
    view = lib.so.dsa_plan_host_view(plan)
    assert view.contents.num_queries == Tq and view.contents.total_key_tokens == Tk
    q = bf16(rng.uniform(-1, 1, (Tq, H, 128)))
    k = bf16(rng.uniform(-1, 1, (Tk, 128)))
    w = rng.uniform(-0.1, 0.1, (Tq, H)).astype(np.float32)
    idx = np.full((Tq, K), -7, np.int32)
    lens = np.full(Tq, -7, np.int32)
    ip = IndexerParams(plan=C.cast(view, P).value, num_heads=H, topk=K, index_q=ptr(q),
                       index_k=ptr(k), weights=ptr(w), weights_dtype=DSA_DTYPE_F32,
                       indices=ptr(idx), lengths=ptr(lens), engine=DSA_INDEXER_ENGINE_DEFAULT)
    lib.check(lib.so.dsa_ref_indexer_topk(C.byref(ip)), "dsa_ref_indexer_topk")
    for t in range(Tq):
        g = Tk - Tq + t
        sc = (np.maximum(np.einsum("hd,sd->hs", f32(q[t]), f32(k[: g + 1])), 0) * w[t][:, None]).sum(0)
        want = np.sort(np.argsort(-sc, kind="stable")[:K])
        assert lens[t] == min(K, g + 1) and (idx[t, : len(want)] == want).all(), f"indexer row {t}"
    lib.so.dsa_plan_destroy(plan)
    print("dsa_plan_create / host view / dsa_ref_indexer_topk ok")

    # ---- attention forward and backward: T=5, H=3, D=576, s_kv=20, K=6, topk_length, sink ----
    T, H, D, S, K, scale = 5, 3, 576, 20, 6, 576 ** -0.5
    q = bf16(rng.uniform(-1, 1, (T, H, D)))
    kv = bf16(rng.uniform(-1, 1, (S, D)))
    ind = np.stack([rng.permutation(S)[:K] for _ in range(T)]).astype(np.int32)
    ind[1, 2] = -1  # an invalid slot
    tlen = np.array([6, 4, 6, 1, 5], np.int32)
    sink = rng.uniform(-1, 1, H).astype(np.float32)
    out = np.zeros((T, H, 512), np.uint16)
    lse = np.zeros((T, H), np.float32)
    fp = AttnFwdParams(num_tokens=T, num_heads=H, head_dim=D, num_kv=S, topk=K,
                       softmax_scale=scale, q=ptr(q), kv=ptr(kv), indices=ptr(ind),
                       topk_length=ptr(tlen), sink=ptr(sink), out=ptr(out), lse=ptr(lse))
    lib.check(lib.so.dsa_ref_sparse_attn_fwd(C.byref(fp)), "dsa_ref_sparse_attn_fwd")
    dout = bf16(rng.uniform(-1, 1, (T, H, 512)))
    dq = np.zeros((T, H, D), np.uint16)
    dkv = np.zeros((S, D), np.uint16)
    dsink = np.zeros(H, np.float32)
    bp = AttnBwdParams(num_tokens=T, num_heads=H, head_dim=D, num_kv=S, topk=K,
                       softmax_scale=scale, deterministic=1, q=ptr(q), kv=ptr(kv), indices=ptr(ind),
                       topk_length=ptr(tlen), sink=ptr(sink), out=ptr(out), dout=ptr(dout),
                       lse=ptr(lse), dq=ptr(dq), dkv=ptr(dkv), dsink=ptr(dsink))
    lib.check(lib.so.dsa_ref_sparse_attn_bwd(C.byref(bp)), "dsa_ref_sparse_attn_bwd")
    # numpy version of the same math (reference.c's header)
    qf, kvf, of, dof = f32(q), f32(kv), f32(out), f32(dout)
    e_out = np.zeros((T, H, 512)); e_lse = np.zeros((T, H)); e_dq = np.zeros((T, H, D))
    e_dkv = np.zeros((S, D)); e_dsink = np.zeros(H)
    for t in range(T):
        slots = [ind[t, j] for j in range(tlen[t]) if 0 <= ind[t, j] < S]
        kr = kvf[slots]                              # [n, D]
        s = scale * qf[t] @ kr.T                     # [H, n]
        e_lse[t] = np.log(np.exp(s).sum(1))
        p = np.exp(s - e_lse[t][:, None])
        e_out[t] = (p @ kr[:, :512]) / (1 + np.exp(sink - e_lse[t]))[:, None]
        Lp = np.logaddexp(lse[t], sink)              # from the reference's own lse, as the bwd does
        P_ = np.exp(scale * qf[t] @ kr.T - Lp[:, None])
        delta = (of[t] * dof[t]).sum(1)              # [H]
        dP = dof[t] @ kr[:, :512].T
        dS = P_ * (dP - delta[:, None])
        e_dq[t] = scale * dS @ kr
        np.add.at(e_dkv, slots, scale * dS.T @ qf[t])
        dv = P_.T @ dof[t]
        for n_, row in enumerate(slots):
            e_dkv[row, :512] += dv[n_]
        e_dsink -= np.exp(sink - Lp) * delta

    def rel(a, b):
        return float(np.abs(a - b).max() / max(np.abs(b).max(), 1e-30))

    errs = {"out": rel(of, e_out), "lse": rel(lse, e_lse), "dq": rel(f32(dq), e_dq),
            "dkv": rel(f32(dkv), e_dkv), "dsink": rel(dsink, e_dsink)}
    print("fwd/bwd reference vs numpy, max rel diff:", {k: f"{v:.1e}" for k, v in errs.items()})
    assert all(v < 1e-2 for v in errs.values()), errs
    print("dsa_ref_sparse_attn_fwd / bwd ok")
    print("self-test passed")


if __name__ == "__main__":
    lib_path = "build/libdsa.so"
    if "--lib" in sys.argv:
        lib_path = sys.argv[sys.argv.index("--lib") + 1]
    _self_test(lib_path)
