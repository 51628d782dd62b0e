"""Graph convolutional latency predictor (LETI paper §4.4, after BRP-NAS), on torch-geometric.

Four dense graph-convolution layers (``torch_geometric.nn.DenseGCNConv``, symmetric normalisation with
self-loops) of ``hidden`` = 600 units with ReLU, a readout (the mean over the cell's vertices, or the
global node's embedding when ``global_node``) and a dense head giving one scalar. Inputs: the cell's
adjacency and one-hot ops (:func:`leti.predict.features.graph_tensors`), optionally each vertex's
FLOPs (``node_flops``). Cells are padded to the space's vertex count and masked, so a whole batch is
a few dense matrix products. The target is the standardised log-latency.

Training runs the torch-geometric module; ``predict`` evaluates the same weights with
:class:`leti.predict.gcn_infer.DenseGCN`, which computes each distinct vertex state once (tested equal
to the module; ``torch_predict`` is the module's own forward). ``precision="bfloat16"`` makes the large
products bfloat16 (faster on CPUs with AMX/AVX-512-BF16, predictions within ~0.5% of float32).

Saved as a torch ``state_dict`` (``model.pt``, read with ``weights_only=True``) plus JSON.
"""

from __future__ import annotations

from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch
from torch import nn
from torch_geometric.nn import DenseGCNConv

from leti.errors import LetiError
from leti.predict.base import Predictor, native_file, register
from leti.predict.features import graph_tensors
from leti.predict.gcn_infer import DIRECT_CELLS, DenseGCN
from leti.spaces.search_space import CellTable

#: cells per chunk of the fast path: big enough for state sharing, small enough for memory (~0.3 GB per state array)
_CHUNK = 16384


@contextmanager
def _threads(n: int, numba_pool: bool = True):
    """Run torch and numba with ``n`` threads (on a busy 2-core machine 1 is fastest), then restore.
    ``numba_pool=False`` leaves numba's pool alone (the few-cell path's kernels are serial)."""
    import numba

    old, want = torch.get_num_threads(), max(1, int(n))
    old_nb = want_nb = numba.get_num_threads()
    if numba_pool:
        want_nb = max(1, min(int(n), numba.config.NUMBA_NUM_THREADS))
    # setting a pool's size costs tens of microseconds even when it does not change: a single-cell
    # prediction (the NAS inner loop) skips it when the pools already have the size
    if old != want:
        torch.set_num_threads(want)
    if old_nb != want_nb:
        numba.set_num_threads(want_nb)
    try:
        yield
    finally:
        if old != want:
            torch.set_num_threads(old)
        if old_nb != want_nb:
            numba.set_num_threads(old_nb)


class _Net(nn.Module):
    def __init__(self, in_features: int, hidden: int, layers: int, dropout: float, global_node: bool) -> None:
        super().__init__()
        dims = [in_features] + [hidden] * layers
        self.convs = nn.ModuleList(DenseGCNConv(a, b) for a, b in zip(dims[:-1], dims[1:]))
        self.dropout = dropout
        self.global_node = global_node
        self.head = nn.Linear(hidden, 1)

    def forward(self, x: torch.Tensor, adj: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        for conv in self.convs:
            x = torch.relu(conv(x, adj, mask))
            x = nn.functional.dropout(x, self.dropout, self.training)
        if self.global_node:
            r = x[:, -1]
        else:
            m = mask.unsqueeze(-1).to(x.dtype)
            r = (x * m).sum(1) / m.sum(1).clamp(min=1)
        return self.head(r).squeeze(-1)


@register
class GCNPredictor(Predictor):
    """GCN on (adjacency, one-hot ops[, vertex FLOPs]); ``epochs`` full passes of Adam."""

    name = "gcn"

    def __init__(self, hidden: int = 600, layers: int = 4, epochs: int = 200, batch_size: int = 64,
                 lr: float = 1e-3, weight_decay: float = 5e-4, dropout: float = 0.0, node_flops: bool = False,
                 global_node: bool = False, random_state: int = 0, threads: int = 1,
                 precision: str = "float32") -> None:
        self.hidden = hidden
        self.layers = layers
        self.epochs = epochs
        self.batch_size = batch_size
        self.lr = lr
        self.weight_decay = weight_decay
        self.dropout = dropout
        self.node_flops = node_flops
        self.global_node = global_node
        self.random_state = random_state
        self.threads = threads
        self.precision = precision

    feature_kind = "graph"

    def _tensors(self, table: CellTable) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        x, a, m = graph_tensors(table, self.node_flops, self.global_node)
        return torch.from_numpy(x), torch.from_numpy(a), torch.from_numpy(m)

    def _build(self, in_features: int) -> _Net:
        return _Net(in_features, self.hidden, self.layers, self.dropout, self.global_node)

    def _fit(self, table: CellTable, y: np.ndarray) -> None:
        with _threads(self.threads):
            self._train(table, y)

    def _train(self, table: CellTable, y: np.ndarray) -> None:
        torch.manual_seed(self.random_state)
        x, a, m = self._tensors(table)
        z = np.log(y)
        self.y_mean_, self.y_std_ = float(z.mean()), float(z.std() or 1.0)
        t = torch.from_numpy(((z - self.y_mean_) / self.y_std_).astype(np.float32))
        self.in_features_ = int(x.shape[2])
        self.net_ = self._build(self.in_features_)
        opt = torch.optim.Adam(self.net_.parameters(), lr=self.lr, weight_decay=self.weight_decay)
        sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, max(self.epochs, 1))
        gen = torch.Generator().manual_seed(self.random_state)
        n = len(t)
        self.net_.train()
        for _ in range(self.epochs):
            for idx in torch.randperm(n, generator=gen).split(self.batch_size):
                opt.zero_grad()
                loss = nn.functional.mse_loss(self.net_(x[idx], a[idx], m[idx]), t[idx])
                loss.backward()
                opt.step()
            sched.step()
        self.net_.eval()
        self.fast_ = None

    def _predict(self, table: CellTable) -> np.ndarray:
        """The fast path: :class:`~leti.predict.gcn_infer.DenseGCN` on the same weights, in chunks."""
        if self.precision not in ("float32", "bfloat16"):
            raise LetiError(f"precision must be 'float32' or 'bfloat16', got {self.precision!r}")
        if getattr(self, "fast_", None) is None:
            self.fast_ = DenseGCN(self.net_.state_dict(), self.layers, self.global_node)
        x, a, m = graph_tensors(table, self.node_flops, self.global_node)
        out, workspace = [], {}  # the chunks share their arrays
        with torch.inference_mode(), _threads(self.threads, numba_pool=len(x) > DIRECT_CELLS):
            for s in range(0, len(x), _CHUNK):
                out.append(self.fast_(x[s:s + _CHUNK], a[s:s + _CHUNK], m[s:s + _CHUNK], self.precision, workspace))
        z = np.concatenate(out).astype(np.float64)
        return np.exp(z * self.y_std_ + self.y_mean_)

    def torch_predict(self, cells) -> np.ndarray:
        """Predictions by the torch-geometric module itself (the reference for the fast path)."""
        self._check_fitted()
        x, a, m = self._tensors(self.table(cells))
        out = []
        with torch.inference_mode(), _threads(self.threads):
            for s in range(0, len(x), 8192):
                out.append(self.net_(x[s:s + 8192], a[s:s + 8192], m[s:s + 8192]).numpy())
        z = np.concatenate(out).astype(np.float64)
        return np.exp(z * self.y_std_ + self.y_mean_)

    def _state(self) -> dict:
        return {"y_mean": self.y_mean_, "y_std": self.y_std_, "in_features": self.in_features_}

    def _set_state(self, state: dict) -> None:
        self.y_mean_, self.y_std_ = float(state["y_mean"]), float(state["y_std"])
        self.in_features_ = int(state["in_features"])

    def _save_files(self, folder: Path) -> None:
        torch.save(self.net_.state_dict(), folder / "model.pt")

    def _load_files(self, folder: Path) -> None:
        self.net_ = self._build(self.in_features_)
        self.net_.load_state_dict(native_file(folder / "model.pt", "GCN (torch tensors)",
                                              lambda p: torch.load(p, weights_only=True, map_location="cpu")))
        self.net_.eval()
        self.fast_ = None
