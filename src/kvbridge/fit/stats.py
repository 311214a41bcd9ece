"""Streaming centred sufficient statistics of paired observations, in float64 (optionally from float32 GEMMs).

For features ``x`` (``p`` dims) and targets ``y`` (``q`` dims) a :class:`MomentStats` keeps

- ``n``: the number of observations,
- ``mean_x`` / ``mean_y``: the running means,
- ``cxx``: the centred co-moment ``Σ (x - x̄)(x - x̄)ᵀ`` (``p × p``), or only its diagonal
  blocks (``[blocks, b, b]``) when the fitter needs no cross-block terms,
- ``cxy``: ``Σ (x - x̄)(y - ȳ)ᵀ`` (``p × q``),
- ``cyy``: the diagonal of ``Σ (y - ȳ)(y - ȳ)ᵀ`` (``q``), all a held-out R² needs.

Memory is fixed by ``p`` and ``q``, never by the number of observations or the batch size:
the statistics plus one reused workspace (a batch is taken in row chunks of :func:`chunk_rows`
rows: float64 ones of about :data:`WORKSPACE_BYTES`, or 1,024-row float32 ones with
``gram_dtype="float32"``, see :class:`MomentStats`; the objects of one :class:`LayerStats` share
one workspace), so the peak of an accumulation is the statistics + :func:`workspace_bytes` (an upper
bound: ``cxx`` and ``cxy`` are allocated on first use, so a split that gets no rows holds none). A batch is
centred on its own mean and merged with the pair-wise update of Chan, Golub & LeVeque
(``C = C_a + C_b + n_a n_b / n · δ δᵀ``, the batch term accumulated straight into ``C`` by
the GEMM), which stays accurate when the means are large against the spread (a raw
``Σ x xᵀ - n x̄ x̄ᵀ`` would cancel catastrophically).

**Additive form (distributed).** Centred co-moments about *different* means do not add.
About one shared centre ``c`` they do: ``Σ (x - c)(x - c)ᵀ = C + n (x̄ - c)(x̄ - c)ᵀ`` is a
plain sum over any partition of the data. :func:`all_reduce` therefore (1) sums ``n`` and
``n · x̄`` over ranks to get the global mean ``μ``, (2) re-centres every rank's moments on
``μ`` (:meth:`MomentStats.recentred`) and (3) sums them: exactly the N-way Chan merge, with
every all-reduce a SUM that ``torch.distributed`` does natively. ``merge`` of two local
objects is the same formula.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

DTYPE = torch.float64
# the workspace rule lives in the torch-free planner (one formula for the plan and the fit)
from kvbridge.fit.plan import (  # noqa: E402,F401
    ADD_ROWS,
    GRAM_DTYPES,
    GRAM_STRIP,
    WORKSPACE_BYTES,
    chunk_rows,
    job_bytes,
    workspace_bytes,
)


class Workspace:
    """A reused ``[rows, p]`` + ``[rows, q]`` pair (float64, or float32 for float32 GEMMs), shared by
    the statistics of one job."""

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self.x = self.y = None
        self.prod = None  # the float32 path's product strip (flat, reused: no fresh pages per chunk)

    def get(self, m: int, p: int, q: int, dtype: torch.dtype = DTYPE) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.x
        if x is None or x.shape[0] < m or x.shape[1] != p or self.y.shape[1] != q or x.dtype != dtype:
            self.x = self.y = x = None  # drop the old pair before allocating the new one
            self.x = torch.empty(m, p, dtype=dtype, device=self.device)
            self.y = torch.empty(m, q, dtype=dtype, device=self.device)
        return self.x[:m], self.y[:m]

    def product(self, rows: int, cols: int) -> torch.Tensor:
        """A reused contiguous float32 ``[rows, cols]`` buffer (the float32 path's GEMM output strip)."""
        n = rows * cols
        if self.prod is None or self.prod.numel() < n:
            self.prod = None
            self.prod = torch.empty(n, dtype=torch.float32, device=self.device)
        return self.prod[:n].view(rows, cols)


MAX_RUNS = 8  # _xx_rows copies blocks for index tensors of at most this many runs of consecutive rows


def _runs(r: torch.Tensor) -> list | None:
    """``[(offset, start, length)]`` of the runs of consecutive rows in the index vector ``r`` (unique
    rows, at most :data:`MAX_RUNS` runs), else None."""
    idx = r.tolist()
    if len(set(idx)) != len(idx):
        return None
    runs = []
    for k, v in enumerate(idx):
        if k and v == idx[k - 1] + 1:
            runs[-1][2] += 1
        else:
            if len(runs) == MAX_RUNS:
                return None
            runs.append([k, v, 1])
    return [tuple(x) for x in runs] if runs else None


def mirror_upper(c: torch.Tensor) -> torch.Tensor:
    """Make the square ``c`` symmetric in place: every element below the diagonal from its transpose
    above it (the upper triangle wins, also inside the diagonal strips), in strips of
    :data:`GRAM_STRIP` rows (no whole-matrix temporary). Returns ``c``."""
    p = int(c.shape[0])
    for i in range(0, p, GRAM_STRIP):
        e = min(p, i + GRAM_STRIP)
        d = c[i:e, i:e]  # the diagonal block: its upper triangle wins too (exactly symmetric)
        d.copy_(d.triu() + d.triu(1).T)
        if e < p:
            c[e:, i:e].copy_(c[i:e, e:].T)
    return c


def _add_rows(dst: torch.Tensor, src: torch.Tensor) -> None:
    """``dst += src`` (float64 += float32) in blocks of :data:`ADD_ROWS` rows (the same sums); one add
    off the CPU (a kernel launch per block would cost more than the cache saves)."""
    if dst.device.type != "cpu":
        dst += src
        return
    for r in range(0, int(src.shape[0]), ADD_ROWS):
        dst[r : r + ADD_ROWS] += src[r : r + ADD_ROWS]


@dataclass
class Moments:
    """A read-only view of (sub-)statistics, what the solvers take."""

    n: float
    mean_x: torch.Tensor  # [p]
    mean_y: torch.Tensor  # [q]
    cxx: torch.Tensor  # [p, p]
    cxy: torch.Tensor  # [p, q]
    cyy: torch.Tensor  # [q] (diagonal)

    @property
    def p(self) -> int:
        return int(self.mean_x.shape[0])

    @property
    def q(self) -> int:
        return int(self.mean_y.shape[0])


class MomentStats:
    """Centred first and second moments of paired observations ``(x, y)``, float64.

    ``xx_block``: ``None`` keeps the full ``p × p`` co-moment; an int ``b`` (dividing ``p``)
    keeps only the ``p / b`` diagonal blocks of size ``b`` (one per source layer or head),
    which is all single-layer or single-head fits need, at ``p·b`` instead of ``p²`` memory.

    ``gram_dtype``: ``"float64"`` (every product in float64) or ``"float32"``: for a full,
    unweighted co-moment each chunk (of :func:`chunk_rows` rows, 1,024; the input rounded to float32)
    is centred on its mean (kept in float64), its ``XcᵀXc`` (upper block triangle only, strips of :data:`GRAM_STRIP` rows)
    and ``XcᵀYc`` multiplied in float32 and added into the float64 statistics (the means, Chan's
    merge and ``cyy`` stay float64); the lower triangle is mirrored once when ``cxx`` is read.
    Weighted updates and block-diagonal co-moments always run in float64.
    """

    TENSORS = ("mean_x", "mean_y", "cxx", "cxy", "cyy")  # what state_dict saves besides n, and merge copies

    def __init__(
        self,
        p: int,
        q: int,
        *,
        xx_block: int | None = None,
        device="cpu",
        workspace: Workspace | None = None,
        gram_dtype: str = "float64",
    ):
        if xx_block is not None and (xx_block <= 0 or p % xx_block):
            raise ValueError(f"xx_block {xx_block} does not divide p={p}")
        if gram_dtype not in GRAM_DTYPES:
            raise ValueError(f"gram_dtype must be one of {', '.join(GRAM_DTYPES)}, got {gram_dtype!r}")
        self.gram_dtype = gram_dtype
        self._lower_stale = False  # float32 path: only the upper block triangle of cxx is accumulated
        self.p, self.q, self.xx_block = int(p), int(q), xx_block
        self.device = torch.device(device)
        self.n = 0.0
        self.mean_x = torch.zeros(p, dtype=DTYPE, device=self.device)
        self.mean_y = torch.zeros(q, dtype=DTYPE, device=self.device)
        # the two large co-moments are allocated on first use (``_xx()``, ``cxy``): statistics of a split
        # that gets no observations (no held-out split) cost no memory and no zero-fill (issue 35)
        self._cxx: torch.Tensor | None = None
        self._cxy: torch.Tensor | None = None
        self.cyy = torch.zeros(q, dtype=DTYPE, device=self.device)
        self._ws = workspace if workspace is not None else Workspace(self.device)

    @staticmethod
    def _zeros(shape: tuple, device) -> torch.Tensor:
        """A zero-filled float64 statistic (the one allocation of the large co-moments)."""
        return torch.zeros(shape, dtype=DTYPE, device=device)

    def _xx(self) -> torch.Tensor:
        """The stored co-moment of ``x`` as it is (the float32 path's lower triangle possibly stale)."""
        if self._cxx is None:
            p, b = self.p, self.xx_block
            self._cxx = self._zeros((p, p) if b is None else (p // b, b, b), self.device)
        return self._cxx

    @property
    def cxy(self) -> torch.Tensor:
        """The centred cross co-moment ``[p, q]`` (allocated on first use)."""
        if self._cxy is None:
            self._cxy = self._zeros((self.p, self.q), self.device)
        return self._cxy

    @cxy.setter
    def cxy(self, value: torch.Tensor) -> None:  # ``self.cxy += t`` assigns the same tensor back
        self._cxy = value

    @property
    def cxx(self) -> torch.Tensor:
        """The centred co-moment of ``x`` (full, symmetric; the float32 path's lower triangle is
        mirrored from the upper one here, once after each run of updates)."""
        if self._lower_stale:
            self._mirror()
        return self._xx()

    def _mirror(self) -> None:
        """Make the float32 path's ``cxx`` symmetric (:func:`mirror_upper`)."""
        mirror_upper(self._xx())
        self._lower_stale = False

    def _xx_rows(self, r: torch.Tensor | slice) -> torch.Tensor:
        """``cxx[r][:, r]`` (``r`` a slice or an index tensor) without mirroring or copying whole rows.

        The float32 path reads every element from the upper triangle (``c[min(i, j), max(i, j)]``:
        exactly the values :meth:`_mirror` would give, so the lower triangle is never needed and never
        mirrored for a solve); an index tensor is gathered element by element (``p_r²`` reads, not the
        ``p_r · p`` of a row gather). A slice of symmetric statistics stays a view.
        """
        c = self._xx()
        if isinstance(r, slice):
            sub = c[r, r]
            return sub if not self._f32 else mirror_upper(sub.clone())  # one copy, mirrored in place
        runs = _runs(r)
        if runs is not None:  # a few runs of consecutive rows (source layers): block copies, row-contiguous reads
            n = int(r.numel())
            out = torch.empty(n, n, dtype=c.dtype, device=c.device)
            for oa, sa, la in runs:
                for ob, sb, lb in runs:
                    dst = out[oa : oa + la, ob : ob + lb]
                    if not self._f32 or sa < sb:
                        dst.copy_(c[sa : sa + la, sb : sb + lb])
                    elif sa > sb:  # below the diagonal: the transpose of the block above it
                        dst.copy_(c[sb : sb + lb, sa : sa + la].mT)
                    else:
                        d = c[sa : sa + la, sa : sa + la]
                        dst.copy_(d.triu() + d.triu(1).mT)
            return out
        i, j = r[:, None], r[None, :]
        if self._f32:
            i, j = torch.minimum(i, j), torch.maximum(i, j)
        return torch.take(c, i * c.shape[1] + j)

    @property
    def _f32(self) -> bool:
        return self.gram_dtype == "float32" and self.xx_block is None

    def chunk_rows(self) -> int:
        """Rows of one accumulation chunk of this object."""
        return chunk_rows(self.p, self.q, gram_dtype="float32" if self._f32 else "float64")

    # -- sizes ------------------------------------------------------------------------------
    @staticmethod
    def nbytes_for(p: int, q: int, xx_block: int | None = None) -> int:
        """Bytes one object of this shape holds (the memory model of the fitters)."""
        xx = p * p if xx_block is None else p * xx_block
        return 8 * (xx + p * q + 2 * p + 2 * q)

    def nbytes(self) -> int:
        return self.nbytes_for(self.p, self.q, self.xx_block)

    # -- accumulation ---------------------------------------------------------------------------
    def _outer_vec(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        if self.xx_block is None:
            return torch.outer(a, b)
        bs = self.xx_block
        return torch.einsum("ki,kj->kij", a.reshape(-1, bs), b.reshape(-1, bs))

    def update(
        self, x: torch.Tensor, y: torch.Tensor, rows: torch.Tensor | None = None, weights: torch.Tensor | None = None
    ) -> "MomentStats":
        """Add a batch of observations ``x [m, p]``, ``y [m, q]`` (any float dtype); with ``rows``
        (an index tensor) only those rows. Taken in row chunks of at most :func:`chunk_rows`.

        ``weights [m]`` (non-negative, aligned with ``x``'s rows): weighted moments, ``n`` then
        counts the summed weight (``Σ w (x - x̄_w)(x - x̄_w)ᵀ`` about the weighted mean; the same
        Chan merge with weights for counts)."""
        if x.dim() != 2 or y.dim() != 2 or x.shape[0] != y.shape[0] or (x.shape[1], y.shape[1]) != (self.p, self.q):
            raise ValueError(
                f"update needs x [m, {self.p}] and y [m, {self.q}], got {tuple(x.shape)} and {tuple(y.shape)}"
            )
        m = int(x.shape[0] if rows is None else rows.numel())
        step = self.chunk_rows() if weights is None else chunk_rows(self.p, self.q)
        for a in range(0, m, step):
            e = min(m, a + step)
            if rows is None:
                self._update_chunk(x[a:e], y[a:e], None if weights is None else weights[a:e])
            else:
                idx = rows[a:e].to(x.device)
                wc = None if weights is None else weights.index_select(0, idx.to(weights.device))
                self._update_chunk(x.index_select(0, idx), y.index_select(0, idx), wc)
        return self

    def _update_chunk(self, x: torch.Tensor, y: torch.Tensor, weights: torch.Tensor | None = None) -> None:
        m = int(x.shape[0])
        if m == 0:
            return
        f32 = weights is None and self._f32  # float32 GEMMs on the chunk centred on its float64 mean
        if f32:
            xc, yc = self._ws.get(m, self.p, self.q, torch.float32)
            mw, mx, my = float(m), self._centre_f32(x, xc), self._centre_f32(y, yc)
        else:
            cxx = self.cxx  # the float64 path adds to the whole matrix: mirror any pending float32 updates
            xc, yc = self._ws.get(m, self.p, self.q)
            xc.copy_(x)
            yc.copy_(y)
            if weights is None:
                mw = float(m)
                mx, my = xc.mean(0), yc.mean(0)
            else:
                wt = weights.to(device=xc.device, dtype=DTYPE).clamp(min=0.0)
                mw = float(wt.sum())
                if mw <= 0:
                    return
                mx, my = (wt @ xc) / mw, (wt @ yc) / mw
            xc -= mx  # the chunk, centred on its own mean, in the reused float64 workspace
            yc -= my
            if weights is not None:  # Σ w xc xcᵀ = (√w xc)ᵀ(√w xc): scale the rows, then the same GEMMs
                root = wt.sqrt()[:, None]
                xc *= root
                yc *= root
        # Chan's update folded into the GEMMs: C += Xcᵀ Xc + w δ δᵀ, with w = n_a m / (n_a + m)
        n = self.n + mw
        w = self.n * mw / n
        dx, dy = mx - self.mean_x, my - self.mean_y
        if f32:
            c, p, q, cxy = self._xx(), self.p, self.q, self.cxy
            for i in range(0, p, GRAM_STRIP):  # upper block triangle only: strip i's product with columns i:
                e = min(p, i + GRAM_STRIP)
                xs = xc[:, i:e].T
                out = self._ws.product(e - i, p - i)  # into one reused buffer, then added in cache-sized rows
                torch.mm(xs, xc[:, i:], out=out)
                _add_rows(c[i:e, i:], out)
                out = self._ws.product(e - i, q)
                torch.mm(xs, yc, out=out)
                _add_rows(cxy[i:e], out)
            self._lower_stale = True
            c.addr_(dx, dx, alpha=w)  # the whole matrix (the mirror overwrites the lower part from the upper)
        elif self.xx_block is None:
            cxx.addmm_(xc.T, xc)
            cxx.addr_(dx, dx, alpha=w)
            self._lower_stale = self._f32  # a float32-Gram object's upper triangle stays the one it reads
        else:
            bs = self.xx_block
            xb = xc.view(m, -1, bs).transpose(0, 1)  # [blocks, m, b]
            cxx.baddbmm_(xb.transpose(1, 2), xb)
            cxx += w * self._outer_vec(dx, dx)
        if not f32:
            self.cxy.addmm_(xc.T, yc)
        self.cxy.addr_(dx, dy, alpha=w)
        for chunk in yc.split(256):  # Σ yc² in row chunks: a bounded temporary, vectorised kernels
            self.cyy += chunk.square().sum(0, dtype=DTYPE)
        self.cyy += w * dy * dy
        self.mean_x += dx * (mw / n)
        self.mean_y += dy * (mw / n)
        self.n = n

    @staticmethod
    def _centre_f32(x: torch.Tensor, out: torch.Tensor) -> torch.Tensor:
        """``out`` (float32) = ``x`` centred; returns the float64 column means. Two passes, no
        temporaries beyond a row: the float32 mean ``c`` is subtracted (``x - c`` is exact in float32
        for float32 inputs near ``c``, so an offset stays out of the products), then the residual
        mean ``r`` of the centred rows; the mean is ``c + r`` in float64. The chunk is centred on the
        mean to float32 rounding ``e``; ``Xcᵀ Xc`` then carries ``m e eᵀ``, ~1e-14 of the spread."""
        out.copy_(x)
        c = out.mean(0)
        out -= c
        r = out.mean(0)
        out -= r
        return c.to(DTYPE) + r.to(DTYPE)

    def merge(self, other: "MomentStats") -> "MomentStats":
        """Fold ``other`` (same shape) into this object (Chan's pairwise update)."""
        if (self.p, self.q, self.xx_block) != (other.p, other.q, other.xx_block):
            raise ValueError(
                f"cannot merge statistics of shape (p={other.p}, q={other.q}, block={other.xx_block}) "
                f"into (p={self.p}, q={self.q}, block={self.xx_block})"
            )
        if other.n == 0:
            return self
        if self.n == 0:
            self.n = other.n
            for name in self.TENSORS:
                getattr(self, name).copy_(getattr(other, name))
            return self
        n = self.n + other.n
        dx = other.mean_x - self.mean_x
        dy = other.mean_y - self.mean_y
        w = self.n * other.n / n
        cxx = self.cxx
        cxx += other.cxx
        cxx += w * self._outer_vec(dx, dx)
        self.cxy += other.cxy
        self.cxy.add_(torch.outer(dx, dy), alpha=w)
        self.cyy += other.cyy + w * dy * dy
        self.mean_x += dx * (other.n / n)
        self.mean_y += dy * (other.n / n)
        self.n = n
        return self

    # -- additive form -------------------------------------------------------------------------
    def recentred(self, cx: torch.Tensor, cy: torch.Tensor) -> dict:
        """Co-moments about the centre ``(cx, cy)``: plain sums over any partition of the data."""
        dx, dy = self.mean_x - cx, self.mean_y - cy
        n = self.n
        return {
            "cxx": self.cxx + n * self._outer_vec(dx, dx),
            "cxy": self.cxy + n * torch.outer(dx, dy),
            "cyy": self.cyy + n * dy * dy,
        }

    # -- views --------------------------------------------------------------------------------
    def moments(
        self,
        rows: torch.Tensor | slice | None = None,
        cols: torch.Tensor | slice | None = None,
        *,
        block: int | None = None,
    ) -> Moments:
        """A :class:`Moments` view over feature ``rows`` and target ``cols`` (index tensors or slices).

        With block-diagonal statistics pass ``block`` (the block index) instead of ``rows``.
        """
        cols = slice(None) if cols is None else cols
        if isinstance(cols, torch.Tensor):
            cols = cols.to(self.device)
        if isinstance(rows, torch.Tensor):
            rows = rows.to(self.device)
        if self.xx_block is not None:
            if block is None:
                raise ValueError("block-diagonal statistics: select one feature block with block=")
            r = slice(block * self.xx_block, (block + 1) * self.xx_block)
        else:
            r = slice(None) if rows is None else rows

        def pick(t: torch.Tensor, rows_, cols_) -> torch.Tensor:  # slices first (views), gathers last
            if not isinstance(rows_, torch.Tensor):
                t = t[rows_]
            if not isinstance(cols_, torch.Tensor):
                t = t[:, cols_]
            if isinstance(rows_, torch.Tensor):
                t = t.index_select(0, rows_)
            return t.index_select(1, cols_) if isinstance(cols_, torch.Tensor) else t

        def vec(t: torch.Tensor, idx) -> torch.Tensor:
            return t.index_select(0, idx) if isinstance(idx, torch.Tensor) else t[idx]

        return Moments(
            n=self.n,
            mean_x=vec(self.mean_x, r),
            mean_y=vec(self.mean_y, cols),
            cxx=self._xx()[block] if self.xx_block is not None else self._xx_rows(r),
            cxy=pick(self.cxy, r, cols),
            cyy=vec(self.cyy, cols),
        )

    # -- persistence -------------------------------------------------------------------------
    def state_dict(self, prefix: str = "") -> dict:
        tensors = {f"{prefix}{name}": getattr(self, name).cpu() for name in self.TENSORS}
        return {f"{prefix}n": torch.tensor([self.n], dtype=DTYPE), **tensors}

    def load_state_dict(self, data: dict, prefix: str = "") -> "MomentStats":
        for name in self.TENSORS:
            t = data[f"{prefix}{name}"]
            cur = getattr(self, name)
            if tuple(t.shape) != tuple(cur.shape):
                raise ValueError(
                    f"checkpoint tensor {prefix}{name} has shape {tuple(t.shape)}, expected {tuple(cur.shape)}"
                )
            cur.copy_(t.to(DTYPE))
        self.n = float(data[f"{prefix}n"][0])
        return self


def all_reduce(stats: list[MomentStats], group=None) -> None:
    """Sum statistics over all ``torch.distributed`` ranks, in place (see the module docstring).

    Three collectives for the whole list, whatever its length: counts and weighted means,
    then every re-centred co-moment in one flat buffer.
    """
    import torch.distributed as dist

    if not stats:
        return
    dev = stats[0].device  # gloo reduces CPU tensors, nccl CUDA ones: keep the statistics' device
    first = torch.cat([torch.cat([s.mean_x.new_tensor([s.n]), s.n * s.mean_x, s.n * s.mean_y]).to(dev) for s in stats])
    dist.all_reduce(first, op=dist.ReduceOp.SUM, group=group)
    centres = []
    for s, c in zip(stats, first.split([1 + s.p + s.q for s in stats])):
        n, mx, my = float(c[0]), c[1 : 1 + s.p], c[1 + s.p :]
        centres.append((n, mx / n if n else mx * 0, my / n if n else my * 0))
    parts = []
    for s, (n, mx, my) in zip(stats, centres):
        rc = s.recentred(mx.to(s.device), my.to(s.device))  # all zeros for an empty rank (n = 0)
        parts.extend(t.reshape(-1).to(dev) for t in (rc["cxx"], rc["cxy"], rc["cyy"]))
    flat = torch.cat(parts)
    del parts
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    off = 0
    for s, (n, mx, my) in zip(stats, centres):
        for cur in (s.cxx, s.cxy, s.cyy):
            cur.copy_(flat[off : off + cur.numel()].view_as(cur))
            off += cur.numel()
        s.n = n
        s.mean_x.copy_(mx)
        s.mean_y.copy_(my)


class StatsSet:
    """The :class:`MomentStats` of one accumulation job: ``self.stats[(..., kind, split)]``."""

    KINDS = ("k", "v")
    SPLITS = ("train", "held")

    def nbytes(self) -> int:
        return sum(s.nbytes() for s in self.stats.values())

    def all_stats(self) -> list[MomentStats]:
        return [self.stats[key] for key in sorted(self.stats)]

    # -- persistence: each MomentStats under its key's parts joined by dots (``k.train.``, ``3.1.k.held.``)
    def state_dict(self, prefix: str = "") -> dict:
        out = {}
        for key, st in self.stats.items():
            out.update(st.state_dict(f"{prefix}{'.'.join(map(str, key))}."))
        return out

    def load_state_dict(self, data: dict, prefix: str = ""):
        for key, st in self.stats.items():
            st.load_state_dict(data, f"{prefix}{'.'.join(map(str, key))}.")
        return self


class LayerStats(StatsSet):
    """Statistics of one accumulation job over layer-structured K/V features.

    Features are the concatenated KV heads of ``src_layers`` (``[layer, head, dim]`` order,
    ``src_heads × src_dim`` dims per layer); targets the KV heads of ``tgt_layers``. For each of
    ``k`` / ``v`` and each split (``train`` / ``held``) one :class:`MomentStats`.
    ``xx_block``: ``"full"`` (any subset of the source layers can be solved jointly),
    ``"layer"`` (single source layers only) or ``"head"`` (single source heads only).
    """

    def __init__(
        self,
        src_layers,
        tgt_layers,
        *,
        src_heads: int,
        src_dim: int,
        tgt_heads: int,
        tgt_dim: int,
        xx_block: str = "full",
        device="cpu",
        gram_dtype: str = "float64",
    ):
        if xx_block not in ("full", "layer", "head"):
            raise ValueError(f"xx_block must be full, layer or head, got {xx_block!r}")
        self.src_layers = tuple(int(i) for i in src_layers)
        self.tgt_layers = tuple(int(i) for i in tgt_layers)
        self.src_heads, self.src_dim, self.tgt_heads, self.tgt_dim = src_heads, src_dim, tgt_heads, tgt_dim
        self.xx_block = xx_block
        p, q = self.p, self.q
        blk = {"full": None, "layer": src_heads * src_dim, "head": src_dim}[xx_block]
        self.workspace = Workspace(device)  # one chunk buffer for the four statistics
        self.stats = {
            (c, s): MomentStats(p, q, xx_block=blk, device=device, workspace=self.workspace, gram_dtype=gram_dtype)
            for c in self.KINDS
            for s in self.SPLITS
        }

    @property
    def p(self) -> int:
        return len(self.src_layers) * self.src_heads * self.src_dim

    @property
    def q(self) -> int:
        return len(self.tgt_layers) * self.tgt_heads * self.tgt_dim

    @staticmethod
    def job_bytes_for(
        n_src: int,
        n_tgt: int,
        *,
        src_heads: int,
        src_dim: int,
        tgt_heads: int,
        tgt_dim: int,
        xx_block: str = "full",
        gram_dtype: str = "float64",
        splits: int = 2,
    ) -> int:
        """The job's peak: statistics + its workspace (the blocking rule, :func:`kvbridge.fit.plan.job_bytes`;
        ``splits``: 1 when no sequence is held out)."""
        return job_bytes(n_src, n_tgt, src_heads * src_dim, src_dim, tgt_heads * tgt_dim, xx_block, gram_dtype, splits)

    # -- accumulation ---------------------------------------------------------------------
    def update(self, feats: dict, held_mask: torch.Tensor | None) -> None:
        """``feats``: ``{"xk", "xv": [n, L_src_all, H, D], "yk", "yv": [n, L_tgt_all, H, D]}`` (all layers)."""
        n_obs = feats["xk"].shape[0]
        # rows [0, split) train, [split, n) held-out when the mask is sorted that way (else None)
        k = n_obs if held_mask is None else int((~held_mask).sum())
        split = k if held_mask is None or not bool(held_mask[:k].any()) else None
        step = self.stats[("k", "train")].chunk_rows()
        for c in self.KINDS:
            fx, fy = feats["x" + c], feats["y" + c]
            if split is not None:  # each split in the statistics' own row chunks: a subset of layers (a
                # blocked pass) is gathered one chunk at a time, never for the whole batch; all layers are views
                for name, a0, a1 in (("train", 0, split), ("held", split, n_obs)):
                    for a in range(a0, a1, step):
                        e = min(a1, a + step)
                        self.stats[(c, name)].update(
                            self._select(fx[a:e], self.src_layers), self._select(fy[a:e], self.tgt_layers)
                        )
                continue
            x = self._select(fx, self.src_layers)
            y = self._select(fy, self.tgt_layers)
            keep = torch.nonzero(~held_mask).flatten()  # row indices: gathered chunk by chunk, no full copy
            if keep.numel():
                self.stats[(c, "train")].update(x, y, rows=keep)
            self.stats[(c, "held")].update(x, y, rows=torch.nonzero(held_mask).flatten())

    @staticmethod
    def _select(t: torch.Tensor, layers: tuple) -> torch.Tensor:
        """``t [n, L, H, D]`` restricted to ``layers`` as ``[n, len(layers)·H·D]`` (a view when it can be)."""
        n = t.shape[0]
        if layers == tuple(range(layers[0], layers[0] + len(layers))):
            return t[:, layers[0] : layers[0] + len(layers)].reshape(n, -1)
        return t.index_select(1, torch.tensor(layers, dtype=torch.long, device=t.device)).reshape(n, -1)

    # -- views ----------------------------------------------------------------------------------
    def n(self, split: str = "train") -> float:
        return self.stats[("k", split)].n

    @staticmethod
    def _span(layers, held: tuple, width: int):
        """Feature rows / target columns of ``layers`` (of the job's ``held`` layers, ``width`` each): a
        slice when they are consecutive, else an index tensor."""
        pos = [held.index(int(i)) for i in layers]
        if pos == list(range(pos[0], pos[0] + len(pos))):
            return slice(pos[0] * width, (pos[-1] + 1) * width)
        return torch.cat([torch.arange(j * width, (j + 1) * width) for j in pos])

    def moments(self, kind: str, split: str, *, tgt_layers, src_layers=None, src_head=None, tgt_head=None) -> Moments:
        """Moments for features = ``src_layers`` (all their heads) or one ``src_head=(layer, head)``,
        targets = ``tgt_layers`` (all their heads) or head ``tgt_head`` of the one layer in ``tgt_layers``."""
        st = self.stats[(kind, split)]
        cols = self._span(tgt_layers, self.tgt_layers, self.tgt_heads * self.tgt_dim)
        if tgt_head is not None:
            cols = slice(cols.start + tgt_head * self.tgt_dim, cols.start + (tgt_head + 1) * self.tgt_dim)
        fs = self.src_heads * self.src_dim
        if src_head is not None:
            layer, head = int(src_head[0]), int(src_head[1])
            j = self.src_layers.index(layer)
            if self.xx_block == "head":
                return st.moments(cols=cols, block=j * self.src_heads + head)
            if self.xx_block == "layer":
                m = st.moments(cols=cols, block=j)
                r = slice(head * self.src_dim, (head + 1) * self.src_dim)
                return Moments(m.n, m.mean_x[r], m.mean_y, m.cxx[r, r], m.cxy[r], m.cyy)
            start = j * fs + head * self.src_dim
            return st.moments(rows=slice(start, start + self.src_dim), cols=cols)
        layers = [int(i) for i in src_layers]
        if self.xx_block == "layer" and len(layers) == 1:
            return st.moments(cols=cols, block=self.src_layers.index(layers[0]))
        if self.xx_block != "full":
            raise ValueError(f"{self.xx_block}-block statistics cannot solve source layers {layers} jointly")
        return st.moments(rows=self._span(layers, self.src_layers, fs), cols=cols)


__all__ = [
    "MomentStats",
    "Moments",
    "LayerStats",
    "StatsSet",
    "Workspace",
    "all_reduce",
    "chunk_rows",
    "workspace_bytes",
    "DTYPE",
    "WORKSPACE_BYTES",
]
