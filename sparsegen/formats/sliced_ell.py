"""Transposed sliced ELL with shared-memory footprint buffers (Hidayetoglu et al., SpDNN 2020).

A layer computes z[j] = sum_i A[j, i] * y[i] for output neurons j (A = W^T in the challenge's
convention Y_{l+1} = Y_l W_l). Output neurons are cut into tiles of `block` rows, one thread
block each. A tile's footprint -- the distinct inputs its rows touch -- is cut into buffers of at
most `buf` slots that the kernel gathers into shared memory. Within a buffer each warp's 32 rows
are stored as ELL, transposed (entry k of all 32 lanes side by side, so loads coalesce), and
padded to the warp's widest row in that buffer; indices point into the buffer, so they fit in
16 bits whenever `buf` <= 65536.

Arrays of the plan:
    map       int32  [slots]            input neuron held by each buffer slot, buffer after buffer
    map_disp  int32  [buffers + 1]      first slot of each buffer
    buf_disp  int32  [tiles + 1]        first buffer of each tile
    warp_disp int32  [buffers*warps+1]  first ELL row (of 32 entries) of each (buffer, warp)
    index     uint16|int32 [rows * 32]  slot within the buffer; padding points at slot 0
    value     float32 [rows * 32]       weight; padding is 0 (absent when every weight is equal)
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from . import Plan

NAME = "sliced_ell"
WARP = 32


def _ranks_in_groups(keys: np.ndarray) -> np.ndarray:
    """For a sorted key array, the position of each element within its run of equal keys."""
    n = keys.size
    if n == 0:
        return np.zeros(0, np.int64)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]])
    first = np.zeros(n, np.int64)
    first[starts] = starts
    np.maximum.accumulate(first, out=first)
    return np.arange(n, dtype=np.int64) - first


def layout(csr: sp.csr_matrix, block: int, buf: int):
    """Vectorized footprint/buffer/warp bookkeeping shared by the encoder and the analyzer."""
    m, k = csr.shape
    rows = np.repeat(np.arange(m, dtype=np.int64), np.diff(csr.indptr))
    cols = csr.indices.astype(np.int64)
    tiles = -(-m // block) if m else 0
    tile = rows // block
    # footprint of each tile: unique (tile, input) pairs, sorted by tile then input
    keys, inverse = np.unique(tile * k + cols, return_inverse=True)
    fp_tile = keys // max(k, 1)
    fp_counts = np.bincount(fp_tile, minlength=tiles)
    fp_start = np.zeros(tiles + 1, np.int64)
    np.cumsum(fp_counts, out=fp_start[1:])
    pos = inverse.reshape(-1) - fp_start[tile]  # slot position within the tile's footprint
    nbuf = -(-fp_counts // buf)
    buf_disp = np.zeros(tiles + 1, np.int64)
    np.cumsum(nbuf, out=buf_disp[1:])
    return rows, cols, tile, keys % max(k, 1), fp_tile, fp_start, pos, buf_disp


def encode(csr: sp.csr_matrix, block: int, buf: int, index_dtype=np.uint16) -> Plan:
    """Encode the layer matrix (rows = output neurons, columns = input neurons)."""
    if block % WARP:
        raise ValueError(f"block must be a multiple of {WARP}, got {block}")
    m, k = csr.shape
    warps = block // WARP
    rows, cols, tile, fp_cols, fp_tile, fp_start, pos, buf_disp = layout(csr, block, buf)
    tiles = buf_disp.size - 1
    nbufs = int(buf_disp[-1])
    u = pos // buf  # buffer within tile
    local = pos % buf  # slot within buffer
    g = buf_disp[tile] + u  # global buffer id
    # map: each buffer's slots are a contiguous chunk of its tile's sorted footprint
    fp_pos = np.arange(fp_cols.size, dtype=np.int64) - fp_start[fp_tile]
    map_disp = np.zeros(nbufs + 1, np.int64)
    if nbufs:
        np.add.at(map_disp, buf_disp[fp_tile] + fp_pos // buf + 1, 1)
    np.cumsum(map_disp, out=map_disp)
    # entries in CSR order are sorted by (row, input) and so by (row, buffer): rank within (row, g)
    kpos = _ranks_in_groups(rows * max(nbufs, 1) + g)
    warp = (rows % block) // WARP
    lane = rows % WARP
    gw = g * warps + warp
    width = np.zeros(nbufs * warps, np.int64)
    if rows.size:
        np.maximum.at(width, gw, kpos + 1)
    warp_disp = np.zeros(nbufs * warps + 1, np.int64)
    np.cumsum(width, out=warp_disp[1:])
    total = int(warp_disp[-1]) * WARP
    index = np.zeros(total, index_dtype)
    value = np.zeros(total, np.float32)
    at = (warp_disp[gw] + kpos) * WARP + lane
    index[at] = local
    value[at] = csr.data
    arrays = {
        "map": fp_cols.astype(np.int32),
        "map_disp": map_disp.astype(np.int32),
        "buf_disp": buf_disp.astype(np.int32),
        "warp_disp": warp_disp.astype(np.int32),
        "index": index,
    }
    # One weight for the whole layer drops the value array, but only when nothing is padded:
    # padding entries point at slot 0 and must contribute a zero weight.
    uniform_value = 0 < csr.nnz == total // WARP * WARP == total and bool(np.all(csr.data == csr.data[0]))
    if not uniform_value:
        arrays["value"] = value
    widths_nonzero = width[width > 0]
    constants = {
        "m": int(m), "k": int(k), "nnz": int(csr.nnz), "tiles": int(tiles), "buffers": nbufs,
        "block": int(block), "buf": int(buf),
        "uniform_value": float(csr.data[0]) if uniform_value else None,
        # one width for every (buffer, warp): the accumulate loop can unroll completely
        "uniform_width": int(width[0]) if width.size and np.all(width == width[0]) else 0,
        # every tile has the same number of buffers, all of one size: the gather loop can unroll too
        "uniform_buffers": int(nbufs // tiles) if tiles and np.all(np.diff(buf_disp) == nbufs // tiles)
        and np.all(np.diff(map_disp) == map_disp[1] - map_disp[0]) else 0,
        "slots_max": int(np.diff(map_disp).max()) if nbufs else 1,
        "max_width": int(widths_nonzero.max()) if widths_nonzero.size else 0,
        "padding": float(total / csr.nnz) if csr.nnz else 1.0,
    }
    return Plan(NAME, arrays, constants)


def expand(plan: Plan):
    """Every stored ELL entry as (output row, input neuron, weight), padding included."""
    a, c = plan.arrays, plan.constants
    block, warps = c["block"], c["block"] // WARP
    warp_disp = a["warp_disp"].astype(np.int64)
    widths = np.diff(warp_disp)
    gw = np.repeat(np.arange(widths.size, dtype=np.int64), widths * WARP)
    within = np.arange(gw.size, dtype=np.int64) - warp_disp[gw] * WARP
    lane = within % WARP
    g, w = gw // warps, gw % warps
    tile = np.searchsorted(a["buf_disp"], g, side="right") - 1
    rows = tile * block + w * WARP + lane
    neuron = a["map"][a["map_disp"][g] + a["index"].astype(np.int64)]
    weight = a["value"] if "value" in a else np.full(gw.size, c["uniform_value"], np.float32)
    return rows, neuron, weight


def layer_product(plan: Plan, y: np.ndarray) -> np.ndarray:
    """z = y · Aᵀ for a batch y (inputs × k), from the plan's arrays alone, in fp32."""
    c = plan.constants
    rows, neuron, weight = expand(plan)
    keep = rows < c["m"]
    a = sp.csr_matrix((weight[keep].astype(np.float32), (rows[keep], neuron[keep])), shape=(c["m"], c["k"]))
    return np.asarray(np.asarray(y, np.float32) @ a.T.astype(np.float32), dtype=np.float32)


def layer(plan: Plan, y: np.ndarray, bias: float, cap: float | None, bias_rule: str = "nonzero") -> np.ndarray:
    """One SpDNN layer as the kernel computes it: product, bias, ReLU, cap."""
    z = layer_product(plan, y)
    if bias_rule == "nonzero":
        z = np.where(z != 0, z + np.float32(bias), np.float32(0))
    else:
        z = z + np.float32(bias)
    z = np.maximum(z, np.float32(0))
    if cap is not None:
        z = np.minimum(z, np.float32(cap))
    return z.astype(np.float32)
