"""`sparsegen inspect --plot`: row-length histogram and spy plot (needs matplotlib, extra `plot`)."""
from __future__ import annotations

import numpy as np

from .errors import SparsegenError


def plot_matrix(csr, stats, path, title: str = "") -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise SparsegenError("--plot needs matplotlib: pip install -e \".[plot]\"") from exc
    lengths = np.diff(csr.indptr)
    fig, (ax_hist, ax_spy) = plt.subplots(1, 2, figsize=(11, 4.6))
    bins = min(60, max(1, int(lengths.max(initial=0)) + 1))
    ax_hist.hist(lengths, bins=bins, color="#3a6ea5")
    ax_hist.set_xlabel("nonzeros per row")
    ax_hist.set_ylabel("rows")
    r = stats.row_lengths
    ax_hist.set_title(f"row lengths: mean {r.mean:.1f}, CoV {r.cov:.2f}, max {r.max}")
    _spy(ax_spy, csr)
    fig.suptitle(f"{title}  {stats.shape[0]}x{stats.shape[1]}, nnz {stats.nnz}, density {100 * stats.density:.3g} %")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _spy(ax, csr, cells: int = 512):
    """Density image on a grid of at most `cells`² bins: a scatter of millions of points is unreadable."""
    m, n = csr.shape
    rows = np.repeat(np.arange(m), np.diff(csr.indptr))
    gm, gn = min(cells, max(m, 1)), min(cells, max(n, 1))
    cell = (rows * gm // max(m, 1)) * gn + csr.indices.astype(np.int64) * gn // max(n, 1)
    img = np.bincount(cell, minlength=gm * gn).reshape(gm, gn).astype(float)
    ax.imshow(img > 0 if img.max() <= 1 else np.log1p(img), cmap="Greys", aspect="auto",
              extent=(0, n, m, 0), interpolation="nearest")
    ax.set_title("pattern (log nonzeros per cell)")
    ax.set_xlabel("column")
    ax.set_ylabel("row")
