"""A small native (C++) kernel for the half-split RoPE rotation on the CPU: one pass, any threads.

The eager half-split rotation (:mod:`kvbridge.rope_kernels`) is three or four elementwise torch
kernels; this one reads each key once and writes it once (the memory-bandwidth floor of any
elementwise op). It is plain C++ with no torch headers, built with the system C++ compiler
(``$CXX``, else ``c++``/``g++``/``clang++``) into a shared library on first use (~1 s of
compiler CPU time), and cached under ``$KVBRIDGE_HOME/native/`` by a hash of its source, the flags and the
compiler (written to a temporary name and renamed: never half-written). It is called through
``ctypes`` on the tensors' memory, which releases the GIL, so several threads can split the rows.

- ``exact`` (:func:`kvbridge.rope.apply`): keys, tables and output in one dtype (float32 or
  bfloat16) and the models' rounding steps: each product and each sum rounded to that dtype
  (``-ffp-contract=off``: no fused multiply-add; bfloat16 by round-to-nearest-even from the
  float32 result, as eager torch does: a product of two bfloat16s is exact in float32).
- not exact (strip, reposition): float32 tables, keys float32 or bfloat16, computed in float32
  and rounded once to the keys' dtype.

The caller (:func:`kvbridge.rope_kernels.fast_rotate`, which also holds the kernel choice) checks
the first result per key against the eager kernel (bit for bit when exact) and falls back to eager
when anything is off; :func:`rotate` raises :class:`Unavailable` for inputs it does not handle (not
CPU, float16/float64, a last dimension that is not contiguous, odd table layouts) and when no
library can be built.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from kvbridge.paths import cache_file
from kvbridge.threads import thread_pool

if TYPE_CHECKING:  # pragma: no cover
    from torch import Tensor

SOURCE = r"""
#include <stdint.h>
#include <string.h>

typedef uint16_t bf16;

static inline float ld(float v) { return v; }
static inline float ld(bf16 b) { uint32_t u = (uint32_t)b << 16; float f; memcpy(&f, &u, 4); return f; }

/* float -> bfloat16, round to nearest even; NaN -> 0x7FC0 (c10's round_to_nearest_even) */
static inline bf16 to_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    uint32_t r = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
    return f != f ? (bf16)0x7FC0 : (bf16)r;
}
static inline void st(float *p, float v) { *p = v; }
static inline void st(bf16 *p, float v) { *p = to_bf16(v); }
static inline float rnd(float v, const float *) { return v; }
/* v rounded to bfloat16 (round to nearest even), kept as a float. Exact path only: every input
   is a bfloat16, so a NaN here has zero low 16 bits (a bfloat16 NaN carried through, or the
   default NaN of an invalid operation) and the rounding add leaves it a NaN: no NaN test needed */
static inline float rnd(float v, const bf16 *) {
    uint32_t u; memcpy(&u, &v, 4);
    u = (u + 0x7FFFu + ((u >> 16) & 1u)) & 0xFFFF0000u;
    float f; memcpy(&f, &u, 4);
    return f;
}

/* rows [row0, row1) of (batch, token) pairs, every head, of x [B, H, T, D] (element strides
   sB, sH, sT; last dim contiguous) into
   out (contiguous [B, H, T, D]); tables [Bp, T, r/2] contiguous, batch stride cB (0: shared) */
template <typename X, typename C, bool EXACT>
static inline __attribute__((always_inline)) void rows(
        const X *x, X *out, const C *cs, const C *sn, int64_t H, int64_t T, int64_t D, int64_t r,
        int64_t sB, int64_t sH, int64_t sT, int64_t cB, int64_t row0, int64_t row1) {
    const int64_t h = r / 2;
    for (int64_t row = row0; row < row1; ++row) {  /* row = (b, t): its table row serves every head */
        const int64_t t = row % T, b = row / T;
        const C *__restrict__ c = cs + b * cB + t * h;
        const C *__restrict__ s = sn + b * cB + t * h;
        for (int64_t hh = 0; hh < H; ++hh) {
        const X *__restrict__ xr = x + b * sB + hh * sH + t * sT;
        X *__restrict__ o = out + ((b * H + hh) * T + t) * D;
#pragma GCC ivdep
        for (int64_t i = 0; i < h; ++i) {
            const float x1 = ld(xr[i]), x2 = ld(xr[i + h]), cc = ld(c[i]), ss = ld(s[i]);
            if (EXACT) {  /* x*cos + rotate_half(x)*sin, every product and sum rounded to X */
                const float a = rnd(x1 * cc, o), b2 = rnd(x2 * ss, o);
                const float d = rnd(x2 * cc, o), e = rnd(x1 * ss, o);
                st(o + i, a - b2);
                st(o + i + h, d + e);
            } else {
                st(o + i, x1 * cc - x2 * ss);
                st(o + i + h, x2 * cc + x1 * ss);
            }
        }
        for (int64_t i = r; i < D; ++i) o[i] = xr[i];
        }
    }
}

/* Exact bfloat16, two elements per 32-bit word: the even one is the low half, the odd one the
   high half (little endian), so widening is one shift or one mask per vector and narrowing
   needs no pack instruction. Same arithmetic and rounding as rows<bf16, bf16, true>. */
static inline float w_lo(uint32_t w) { uint32_t u = w << 16; float f; memcpy(&f, &u, 4); return f; }
static inline float w_hi(uint32_t w) { uint32_t u = w & 0xFFFF0000u; float f; memcpy(&f, &u, 4); return f; }
static inline float r16(float v) { return rnd(v, (const bf16 *)0); }
static inline uint32_t top16(float v) {  /* bfloat16 bits of v in the high half (NaN -> 0x7FC0) */
    uint32_t u; memcpy(&u, &v, 4);
    u = u + 0x7FFFu + ((u >> 16) & 1u);
    return v != v ? 0x7FC00000u : u;
}
static inline uint32_t ld32(const bf16 *p) { uint32_t w; memcpy(&w, p, 4); return w; }

static inline __attribute__((always_inline)) void rows_bf16_pairs(
        const bf16 *x, bf16 *out, const bf16 *cs, const bf16 *sn, int64_t H, int64_t T, int64_t D, int64_t r,
        int64_t sB, int64_t sH, int64_t sT, int64_t cB, int64_t row0, int64_t row1) {
    const int64_t h = r / 2, hw = h / 2;
    for (int64_t row = row0; row < row1; ++row) {
        const int64_t t = row % T, b = row / T;
        const bf16 *c = cs + b * cB + t * h, *s = sn + b * cB + t * h;
        for (int64_t hh = 0; hh < H; ++hh) {
        const bf16 *xr = x + b * sB + hh * sH + t * sT;
        bf16 *o = out + ((b * H + hh) * T + t) * D;
#pragma GCC ivdep
        for (int64_t j = 0; j < hw; ++j) {
            const uint32_t w1 = ld32(xr + 2 * j), w2 = ld32(xr + h + 2 * j);
            const uint32_t wc = ld32(c + 2 * j), ws = ld32(s + 2 * j);
            const float x1e = w_lo(w1), x2e = w_lo(w2), ce = w_lo(wc), se = w_lo(ws);
            const float x1o = w_hi(w1), x2o = w_hi(w2), co = w_hi(wc), so = w_hi(ws);
            const float ae = r16(x1e * ce) - r16(x2e * se), de = r16(x2e * ce) + r16(x1e * se);
            const float ao = r16(x1o * co) - r16(x2o * so), dout = r16(x2o * co) + r16(x1o * so);
            const uint32_t o1 = (top16(ae) >> 16) | (top16(ao) & 0xFFFF0000u);
            const uint32_t o2 = (top16(de) >> 16) | (top16(dout) & 0xFFFF0000u);
            memcpy(o + 2 * j, &o1, 4);
            memcpy(o + h + 2 * j, &o2, 4);
        }
        for (int64_t i = r; i < D; ++i) o[i] = xr[i];
        }
    }
}

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define KVB_CLONES __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define KVB_CLONES
#endif

/* kind: 0 exact float32, 1 exact bfloat16, 2 float32 keys / float32 tables, 3 bfloat16 keys /
   float32 tables. Returns 0, or -1 for an unknown kind. */
extern "C" KVB_CLONES int kvb_rope_half(
        int kind, const void *x, void *out, const void *cs, const void *sn, int64_t H, int64_t T,
        int64_t D, int64_t r, int64_t sB, int64_t sH, int64_t sT, int64_t cB, int64_t row0,
        int64_t row1) {
    switch (kind) {
    case 0: rows<float, float, true>((const float *)x, (float *)out, (const float *)cs, (const float *)sn,
                                     H, T, D, r, sB, sH, sT, cB, row0, row1); return 0;
    case 1:
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
        if (r % 4 == 0) {
            rows_bf16_pairs((const bf16 *)x, (bf16 *)out, (const bf16 *)cs, (const bf16 *)sn,
                            H, T, D, r, sB, sH, sT, cB, row0, row1);
            return 0;
        }
#endif
        rows<bf16, bf16, true>((const bf16 *)x, (bf16 *)out, (const bf16 *)cs, (const bf16 *)sn,
                                   H, T, D, r, sB, sH, sT, cB, row0, row1); return 0;
    case 2: rows<float, float, false>((const float *)x, (float *)out, (const float *)cs, (const float *)sn,
                                      H, T, D, r, sB, sH, sT, cB, row0, row1); return 0;
    case 3: rows<bf16, float, false>((const bf16 *)x, (bf16 *)out, (const float *)cs, (const float *)sn,
                                     H, T, D, r, sB, sH, sT, cB, row0, row1); return 0;
    }
    return -1;
}
"""

FLAGS = ["-O3", "-fPIC", "-shared", "-ffp-contract=off", "-fno-fast-math", "-std=c++11"]
PARALLEL_MIN_ELEMENTS = 1 << 18  # split rows over threads only above this many elements
_KIND = {
    (torch.float32, torch.float32, True): 0,
    (torch.bfloat16, torch.bfloat16, True): 1,
    (torch.float32, torch.float32, False): 2,
    (torch.bfloat16, torch.float32, False): 3,
}
_LIB: dict = {}
_LOCK = threading.Lock()


class Unavailable(RuntimeError):
    """The native kernel cannot run here (no compiler, a failed build) or on these inputs."""


def compiler() -> str | None:
    """The C++ compiler used: ``$CXX``, else the first of ``c++``, ``g++``, ``clang++`` on PATH."""
    cxx = os.environ.get("CXX")
    if cxx:
        return shutil.which(cxx) or None
    return next(filter(None, map(shutil.which, ("c++", "g++", "clang++"))), None)


def library_path(cxx: str) -> tuple:
    """``(folder or None, file name)`` of the cached library for this source, flags and compiler."""
    try:  # the compiler binary itself (no process spawned on the warm path)
        real = os.path.realpath(cxx)
        st = os.stat(real)
        version = f"{real}:{st.st_size}:{st.st_mtime_ns}"
    except OSError:
        version = ""
    digest = hashlib.sha256(
        "\0".join([SOURCE, " ".join(FLAGS), cxx, version, platform.machine(), platform.system()]).encode()
    ).hexdigest()[:16]
    return cache_file("native"), f"kvb_rope_{digest}.so"


def _build(cxx: str, retry_failed: bool) -> Path:
    folder, name = library_path(cxx)
    if folder is not None:
        lib, failed = folder / name, folder / (name + ".failed")
        if lib.is_file():
            return lib
        if failed.is_file() and not retry_failed:  # this compiler failed before: do not retry each process
            raise Unavailable(f"building the native RoPE kernel failed before (remove {failed} to retry)")
        try:
            folder.mkdir(parents=True, exist_ok=True)
            work = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))
        except OSError:  # a cache folder we cannot write
            folder = None
    private = folder is None
    if private:  # no cache: a private folder for this process
        folder = Path(tempfile.mkdtemp(prefix="kvbridge-native-"))
        work = Path(tempfile.mkdtemp(prefix=".build-", dir=folder))
    try:
        src = work / "rope.cpp"
        src.write_text(SOURCE, encoding="utf-8")
        tmp = work / name
        proc = subprocess.run([cxx, *FLAGS, str(src), "-o", str(tmp)], capture_output=True, text=True, timeout=300)
        if proc.returncode != 0:
            detail = (proc.stderr or proc.stdout).strip().splitlines()
            message = f"building the native RoPE kernel failed: {detail[0] if detail else proc.returncode}"
            if not private:
                (work / "failed").write_text(message + "\n", encoding="utf-8")
                os.replace(work / "failed", folder / (name + ".failed"))
            raise Unavailable(message)
        lib = folder / name
        os.replace(tmp, lib)  # atomic: another process sees the whole file or none
        return lib
    except BaseException:
        if private:
            shutil.rmtree(folder, ignore_errors=True)
        raise
    finally:
        shutil.rmtree(work, ignore_errors=True)


def library(retry_failed: bool = True) -> ctypes.CDLL:
    """The loaded native library, built (or found in the cache) on first use.

    ``retry_failed=False`` (the default ``auto`` mode) does not retry a build that failed
    before with this compiler (a ``.failed`` note in the cache), so a broken compiler costs
    one attempt, not one per process."""
    lib = _LIB.get("lib")
    if lib is not None:  # the warm path: no lock
        return lib
    with _LOCK:
        if "lib" not in _LIB:
            if "error" in _LIB:
                raise Unavailable(_LIB["error"])
            cxx = compiler()
            try:
                if cxx is None:
                    raise Unavailable("no C++ compiler found (set CXX)")
                path = _build(cxx, retry_failed)
                lib = ctypes.CDLL(str(path))
                if path.parent.name.startswith("kvbridge-native-"):  # a private build: loaded, remove it
                    shutil.rmtree(path.parent, ignore_errors=True)
            except (OSError, subprocess.SubprocessError) as exc:
                _LIB["error"] = f"native RoPE kernel unavailable: {type(exc).__name__}: {exc}"
                raise Unavailable(_LIB["error"]) from None
            except Unavailable as exc:
                _LIB["error"] = str(exc)
                raise
            fn = lib.kvb_rope_half
            fn.restype = ctypes.c_int
            fn.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 4 + [ctypes.c_int64] * 10
            _LIB["lib"], _LIB["path"] = lib, path
        return _LIB["lib"]


def supports(
    x: "Tensor", cos: "Tensor", sin: "Tensor", out_dtype: torch.dtype, *, exact: bool, rotary_dim: int
) -> bool:
    """Whether :func:`rotate` takes these inputs (else the caller uses the eager kernel)."""
    if _KIND.get((x.dtype, cos.dtype, bool(exact))) is None or out_dtype != x.dtype or sin.dtype != cos.dtype:
        return False
    if not (x.is_cpu and cos.is_cpu and sin.is_cpu) or x.requires_grad or rotary_dim % 2:
        return False
    shape = x.shape
    if len(shape) != 4 or x.stride(3) != 1 or not 0 < rotary_dim <= shape[3]:
        return False
    want = (1, shape[2], rotary_dim // 2)  # tables [1 or B, 1, T, rotary_dim / 2], contiguous
    return all(
        t.dim() == 4 and t.shape[1:] == want and t.shape[0] in (1, shape[0]) and t.is_contiguous() for t in (cos, sin)
    )


def rotate(
    x: "Tensor",
    cos: "Tensor",
    sin: "Tensor",
    out_dtype: torch.dtype,
    *,
    exact: bool,
    rotary_dim: int,
    retry_failed: bool = True,
    checked: bool = False,
) -> "Tensor":
    """Half-split rotation of ``x [B, H, T, D]``'s first ``rotary_dim`` dims by ``cos``/``sin``
    ``[Bp, 1, T, rotary_dim/2]`` (Bp 1 or B), the rest copied; a new contiguous tensor.

    Inputs outside :func:`supports` raise ``ValueError`` (``checked``: the caller asked it
    already); no library: :class:`Unavailable`.
    """
    if not checked and not supports(x, cos, sin, out_dtype, exact=exact, rotary_dim=rotary_dim):
        raise ValueError(
            f"native RoPE kernel: unsupported inputs ({x.dtype} keys {tuple(x.shape)}, "
            f"{cos.dtype} tables {tuple(cos.shape)}, exact={exact})"
        )
    kind = _KIND[(x.dtype, cos.dtype, bool(exact))]
    b, heads, tokens, d = x.shape
    fn = library(retry_failed).kvb_rope_half
    out = torch.empty(x.shape, dtype=x.dtype)
    n_rows = b * tokens
    if n_rows == 0:
        return out
    cb = tokens * (rotary_dim // 2) if cos.shape[0] == b and b > 1 else 0
    args = (kind, x.data_ptr(), out.data_ptr(), cos.data_ptr(), sin.data_ptr(), heads, tokens, d, rotary_dim)
    args += (*x.stride()[:3], cb)  # element strides of batch, head and token; the tables' batch stride
    threads = torch.get_num_threads()
    if threads <= 1 or x.numel() < PARALLEL_MIN_ELEMENTS:
        codes = [fn(*args, 0, n_rows)]
    else:
        step, pool = -(-n_rows // threads), thread_pool("kvbridge-rope", threads)
        jobs = [pool.submit(fn, *args, r0, min(r0 + step, n_rows)) for r0 in range(0, n_rows, step)]
        codes = [j.result() for j in jobs]
    if any(code != 0 for code in codes):
        raise Unavailable("native RoPE kernel rejected its arguments")
    return out
