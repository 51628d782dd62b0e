"""The NAS-Bench-101 hash of many cells at once: MD5 in SIMD lanes.

The hash (:func:`leti.spaces.nb101_hash.nb101_hash`) is about 55 MD5 digests per cell, 54 million
MD5 blocks for the 423,624 NB101 cells: hashing one message at a time (~200 ns a block with the
message building) made it most of ``leti generate --all``. A digest's 64 steps are a serial chain,
but the digests of one refinement round are independent, so this module computes them side by
side: each round's messages are written into a job buffer, grouped by their number of blocks, and
each group is compressed by one loop over lanes whose body is the unrolled 64 steps (LLVM turns
the lane loop into AVX2/NEON vector code: ~16-30 ns a block instead of ~100 scalar). Messages,
sorted joins and the final ``str(sorted(h))`` text are byte for byte those of the reference; the
tests compare both on every kind of cell and the whole space against the golden sha256.

The 64 steps are written out (generated once from the MD5 tables: constant shifts and constants
let the compiler emit immediate operands; numba inlines the step helpers, or the lane loop would
not vectorise). Word loads view the job bytes as little-endian uint32, so the caller uses this
path on little-endian hosts only.
"""

from __future__ import annotations

import numba
import numpy as np

U = np.uint32
_HEX = np.frombuffer(b"0123456789abcdef", dtype=np.uint8).copy()


@numba.njit(cache=True, inline="always")
def _rotl(x, s):
    return U((x << U(s)) | (x >> U(32 - s)))


@numba.njit(cache=True, inline="always")
def _step(f, a, b, m, k, s):
    return U(b + _rotl(U(a + f + m + U(k)), s))


@numba.njit(cache=True, inline="always")
def _f(b, c, d):
    return U((b & c) | (~b & d))


@numba.njit(cache=True, inline="always")
def _g(b, c, d):
    return U((b & d) | (c & ~d))


@numba.njit(cache=True, inline="always")
def _h(b, c, d):
    return U(b ^ c ^ d)


@numba.njit(cache=True, inline="always")
def _i(b, c, d):
    return U(c ^ (b | ~d))


@numba.njit(cache=True)
def _compress(st, m):
    """One MD5 block per lane: ``st`` (4, lanes) state, ``m`` (16, lanes) message words."""
    for l in range(st.shape[1]):
        a = U(st[0, l])
        b = U(st[1, l])
        c = U(st[2, l])
        d = U(st[3, l])
        a0, b0, c0, d0 = a, b, c, d
        m0 = U(m[0, l])
        m1 = U(m[1, l])
        m2 = U(m[2, l])
        m3 = U(m[3, l])
        m4 = U(m[4, l])
        m5 = U(m[5, l])
        m6 = U(m[6, l])
        m7 = U(m[7, l])
        m8 = U(m[8, l])
        m9 = U(m[9, l])
        m10 = U(m[10, l])
        m11 = U(m[11, l])
        m12 = U(m[12, l])
        m13 = U(m[13, l])
        m14 = U(m[14, l])
        m15 = U(m[15, l])
        a = _step(_f(b, c, d), a, b, m0, 0xd76aa478, 7)
        d = _step(_f(a, b, c), d, a, m1, 0xe8c7b756, 12)
        c = _step(_f(d, a, b), c, d, m2, 0x242070db, 17)
        b = _step(_f(c, d, a), b, c, m3, 0xc1bdceee, 22)
        a = _step(_f(b, c, d), a, b, m4, 0xf57c0faf, 7)
        d = _step(_f(a, b, c), d, a, m5, 0x4787c62a, 12)
        c = _step(_f(d, a, b), c, d, m6, 0xa8304613, 17)
        b = _step(_f(c, d, a), b, c, m7, 0xfd469501, 22)
        a = _step(_f(b, c, d), a, b, m8, 0x698098d8, 7)
        d = _step(_f(a, b, c), d, a, m9, 0x8b44f7af, 12)
        c = _step(_f(d, a, b), c, d, m10, 0xffff5bb1, 17)
        b = _step(_f(c, d, a), b, c, m11, 0x895cd7be, 22)
        a = _step(_f(b, c, d), a, b, m12, 0x6b901122, 7)
        d = _step(_f(a, b, c), d, a, m13, 0xfd987193, 12)
        c = _step(_f(d, a, b), c, d, m14, 0xa679438e, 17)
        b = _step(_f(c, d, a), b, c, m15, 0x49b40821, 22)
        a = _step(_g(b, c, d), a, b, m1, 0xf61e2562, 5)
        d = _step(_g(a, b, c), d, a, m6, 0xc040b340, 9)
        c = _step(_g(d, a, b), c, d, m11, 0x265e5a51, 14)
        b = _step(_g(c, d, a), b, c, m0, 0xe9b6c7aa, 20)
        a = _step(_g(b, c, d), a, b, m5, 0xd62f105d, 5)
        d = _step(_g(a, b, c), d, a, m10, 0x02441453, 9)
        c = _step(_g(d, a, b), c, d, m15, 0xd8a1e681, 14)
        b = _step(_g(c, d, a), b, c, m4, 0xe7d3fbc8, 20)
        a = _step(_g(b, c, d), a, b, m9, 0x21e1cde6, 5)
        d = _step(_g(a, b, c), d, a, m14, 0xc33707d6, 9)
        c = _step(_g(d, a, b), c, d, m3, 0xf4d50d87, 14)
        b = _step(_g(c, d, a), b, c, m8, 0x455a14ed, 20)
        a = _step(_g(b, c, d), a, b, m13, 0xa9e3e905, 5)
        d = _step(_g(a, b, c), d, a, m2, 0xfcefa3f8, 9)
        c = _step(_g(d, a, b), c, d, m7, 0x676f02d9, 14)
        b = _step(_g(c, d, a), b, c, m12, 0x8d2a4c8a, 20)
        a = _step(_h(b, c, d), a, b, m5, 0xfffa3942, 4)
        d = _step(_h(a, b, c), d, a, m8, 0x8771f681, 11)
        c = _step(_h(d, a, b), c, d, m11, 0x6d9d6122, 16)
        b = _step(_h(c, d, a), b, c, m14, 0xfde5380c, 23)
        a = _step(_h(b, c, d), a, b, m1, 0xa4beea44, 4)
        d = _step(_h(a, b, c), d, a, m4, 0x4bdecfa9, 11)
        c = _step(_h(d, a, b), c, d, m7, 0xf6bb4b60, 16)
        b = _step(_h(c, d, a), b, c, m10, 0xbebfbc70, 23)
        a = _step(_h(b, c, d), a, b, m13, 0x289b7ec6, 4)
        d = _step(_h(a, b, c), d, a, m0, 0xeaa127fa, 11)
        c = _step(_h(d, a, b), c, d, m3, 0xd4ef3085, 16)
        b = _step(_h(c, d, a), b, c, m6, 0x04881d05, 23)
        a = _step(_h(b, c, d), a, b, m9, 0xd9d4d039, 4)
        d = _step(_h(a, b, c), d, a, m12, 0xe6db99e5, 11)
        c = _step(_h(d, a, b), c, d, m15, 0x1fa27cf8, 16)
        b = _step(_h(c, d, a), b, c, m2, 0xc4ac5665, 23)
        a = _step(_i(b, c, d), a, b, m0, 0xf4292244, 6)
        d = _step(_i(a, b, c), d, a, m7, 0x432aff97, 10)
        c = _step(_i(d, a, b), c, d, m14, 0xab9423a7, 15)
        b = _step(_i(c, d, a), b, c, m5, 0xfc93a039, 21)
        a = _step(_i(b, c, d), a, b, m12, 0x655b59c3, 6)
        d = _step(_i(a, b, c), d, a, m3, 0x8f0ccc92, 10)
        c = _step(_i(d, a, b), c, d, m10, 0xffeff47d, 15)
        b = _step(_i(c, d, a), b, c, m1, 0x85845dd1, 21)
        a = _step(_i(b, c, d), a, b, m8, 0x6fa87e4f, 6)
        d = _step(_i(a, b, c), d, a, m15, 0xfe2ce6e0, 10)
        c = _step(_i(d, a, b), c, d, m6, 0xa3014314, 15)
        b = _step(_i(c, d, a), b, c, m13, 0x4e0811a1, 21)
        a = _step(_i(b, c, d), a, b, m4, 0xf7537e82, 6)
        d = _step(_i(a, b, c), d, a, m11, 0xbd3af235, 10)
        c = _step(_i(d, a, b), c, d, m2, 0x2ad7d2bb, 15)
        b = _step(_i(c, d, a), b, c, m9, 0xeb86d391, 21)
        st[0, l] = U(a0 + a)
        st[1, l] = U(b0 + b)
        st[2, l] = U(c0 + c)
        st[3, l] = U(d0 + d)


@numba.njit(cache=True)
def _pad(buf, j, n):
    """MD5 padding of the ``n``-byte message in job row ``j``; returns its number of blocks."""
    total = n + 1
    while total % 64 != 56:
        total += 1
    buf[j, n] = 0x80
    for i in range(n + 1, total):
        buf[j, i] = 0
    bits = np.uint64(n) * np.uint64(8)
    for i in range(8):
        buf[j, total + i] = (bits >> np.uint64(8 * i)) & np.uint64(0xFF)
    return (total + 8) // 64


@numba.njit(cache=True)
def _digest_jobs(buf, nblk, njobs, dest, hexout, keys):
    """MD5 of jobs ``0 .. njobs`` (padded messages in ``buf`` rows, ``nblk`` blocks each): the hex
    digest of job ``j`` goes to ``hexout[dest[j]]`` and its order key (the digest as two big-endian
    uint64: lexicographic order of the hex text) to ``keys[dest[j]]``. Jobs of equal block count are
    compressed together, one lane each."""
    if njobs == 0:
        return
    words = buf.view(np.uint32)
    most = nblk[:njobs].max()
    count = np.zeros(most + 2, np.int64)
    for j in range(njobs):  # counting sort by block count
        count[nblk[j] + 1] += 1
    for b in range(1, most + 2):
        count[b] += count[b - 1]
    start = count.copy()
    order = np.empty(njobs, np.int64)
    for j in range(njobs):
        order[count[nblk[j]]] = j
        count[nblk[j]] += 1
    for nb in range(1, most + 1):
        lanes = start[nb + 1] - start[nb]
        if lanes == 0:
            continue
        group = order[start[nb]:start[nb + 1]]
        st = np.empty((4, lanes), np.uint32)
        m = np.empty((16, lanes), np.uint32)
        for l in range(lanes):
            st[0, l] = 0x67452301
            st[1, l] = 0xEFCDAB89
            st[2, l] = 0x98BADCFE
            st[3, l] = 0x10325476
        for b in range(nb):
            for l in range(lanes):
                for w in range(16):
                    m[w, l] = words[group[l], 16 * b + w]
            _compress(st, m)
        for l in range(lanes):
            r = dest[group[l]]
            for w in range(4):
                v = st[w, l]
                for byte in range(4):
                    x = (v >> U(8 * byte)) & U(0xFF)
                    hexout[r, 8 * w + 2 * byte] = _HEX[x >> U(4)]
                    hexout[r, 8 * w + 2 * byte + 1] = _HEX[x & U(0xF)]
            keys[r, 0] = (np.uint64(_bswap(st[0, l])) << np.uint64(32)) | np.uint64(_bswap(st[1, l]))
            keys[r, 1] = (np.uint64(_bswap(st[2, l])) << np.uint64(32)) | np.uint64(_bswap(st[3, l]))


@numba.njit(cache=True)
def _bswap(x):
    return U(((x & U(0xFF)) << U(24)) | ((x & U(0xFF00)) << U(8)) | ((x >> U(8)) & U(0xFF00)) | (x >> U(24)))


@numba.njit(cache=True)
def _put_int(buf, j, p, x):
    """``str(x)`` of a python int at ``buf[j, p:]``; returns the new position."""
    if x < 0:
        buf[j, p] = 45  # -
        p += 1
        x = -x
    digits = 1
    t = x
    while t >= 10:
        t //= 10
        digits += 1
    for q in range(digits - 1, -1, -1):
        buf[j, p + q] = 48 + x % 10
        x //= 10
    return p + digits


@numba.njit(cache=True)
def _sorted_by_key(keys, base, idx, cnt):
    """Insertion sort of ``idx[:cnt]`` (vertex numbers) by their digest's order key."""
    for i in range(1, cnt):
        j = i
        while j > 0:
            a, b = base + idx[j], base + idx[j - 1]
            if keys[a, 0] < keys[b, 0] or (keys[a, 0] == keys[b, 0] and keys[a, 1] < keys[b, 1]):
                idx[j], idx[j - 1] = idx[j - 1], idx[j]
                j -= 1
            else:
                break


@numba.njit(cache=True)
def _put_digests(buf, j, p, hx, base, idx, cnt):
    for q in range(cnt):
        r = base + idx[q]
        for i in range(32):
            buf[j, p + i] = hx[r, i]
        p += 32
    return p


@numba.njit(cache=True)
def _hash_chunk(adj, lab, nv, out):
    """Hashes of the cells of one chunk into ``out`` (cells, 32) hex bytes."""
    n, v = lab.shape
    blocks = (max(32 * v + 2, 34 * v + 2 * v + 2) + 9 + 63) // 64 + 1  # longest message, padded
    buf = np.empty((n * v, 64 * blocks), np.uint8)
    nblk = np.empty(n * v, np.int64)
    dest = np.empty(n * v, np.int64)
    hx = np.empty((n * v, 32), np.uint8)
    hx2 = np.empty((n * v, 32), np.uint8)
    keys = np.empty((n * v, 2), np.uint64)
    keys2 = np.empty((n * v, 2), np.uint64)
    ins = np.empty((n, v, v), np.int64)
    outs = np.empty((n, v, v), np.int64)
    nin = np.zeros((n, v), np.int64)
    nout = np.zeros((n, v), np.int64)
    idx = np.empty(v, np.int64)
    rounds = 0
    for c in range(n):
        rounds = max(rounds, nv[c])
        for i in range(nv[c]):
            for k in range(i + 1, nv[c]):
                if adj[c, i, k]:
                    outs[c, i, nout[c, i]] = k
                    nout[c, i] += 1
                    ins[c, k, nin[c, k]] = i
                    nin[c, k] += 1
    jobs = 0
    for c in range(n):  # h[v] = md5(str((out_degree, in_degree, label)))
        for i in range(nv[c]):
            buf[jobs, 0] = 40  # (
            p = _put_int(buf, jobs, 1, nout[c, i])
            buf[jobs, p] = 44  # ,
            buf[jobs, p + 1] = 32
            p = _put_int(buf, jobs, p + 2, nin[c, i])
            buf[jobs, p] = 44
            buf[jobs, p + 1] = 32
            p = _put_int(buf, jobs, p + 2, lab[c, i])
            buf[jobs, p] = 41  # )
            nblk[jobs] = _pad(buf, jobs, p + 1)
            dest[jobs] = c * v + i
            jobs += 1
    _digest_jobs(buf, nblk, jobs, dest, hx, keys)
    for r in range(rounds):  # nv[c] rounds for cell c: "".join(sorted(in)) | "".join(sorted(out)) | own
        jobs = 0
        for c in range(n):
            if nv[c] <= r:
                continue
            base = c * v
            for i in range(nv[c]):
                idx[:nin[c, i]] = ins[c, i, :nin[c, i]]
                _sorted_by_key(keys, base, idx, nin[c, i])
                p = _put_digests(buf, jobs, 0, hx, base, idx, nin[c, i])
                buf[jobs, p] = 124  # |
                idx[:nout[c, i]] = outs[c, i, :nout[c, i]]
                _sorted_by_key(keys, base, idx, nout[c, i])
                p = _put_digests(buf, jobs, p + 1, hx, base, idx, nout[c, i])
                buf[jobs, p] = 124
                idx[0] = i
                p = _put_digests(buf, jobs, p + 1, hx, base, idx, 1)
                nblk[jobs] = _pad(buf, jobs, p)
                dest[jobs] = base + i
                jobs += 1
        _digest_jobs(buf, nblk, jobs, dest, hx2, keys2)
        for j in range(jobs):
            r2 = dest[j]
            hx[r2] = hx2[r2]
            keys[r2] = keys2[r2]
    for c in range(n):  # md5(str(sorted(h))): "['..', '..']"
        for i in range(nv[c]):
            idx[i] = i
        _sorted_by_key(keys, c * v, idx, nv[c])
        buf[c, 0] = 91  # [
        p = 1
        for q in range(nv[c]):
            if q:
                buf[c, p] = 44
                buf[c, p + 1] = 32
                p += 2
            buf[c, p] = 39  # '
            p = _put_digests(buf, c, p + 1, hx, c * v, idx[q:], 1)
            buf[c, p] = 39
            p += 1
        buf[c, p] = 93  # ]
        nblk[c] = _pad(buf, c, p + 1)
        dest[c] = c
    _digest_jobs(buf, nblk, n, dest, out, keys2)


@numba.njit(cache=True, parallel=True)
def hash_cells(adj, lab, nv, out, chunk):
    """NB101 hashes of all cells (``adj`` (N, V, V) uint8, ``lab`` (N, V) int64, ``nv`` (N,)) as hex
    bytes into ``out`` (N, 32), ``chunk`` cells per task (their buffers stay in cache)."""
    n = lab.shape[0]
    for t in numba.prange((n + chunk - 1) // chunk):
        lo = t * chunk
        hi = min(n, lo + chunk)
        _hash_chunk(adj[lo:hi], lab[lo:hi], nv[lo:hi], out[lo:hi])
