"""PyTorch algebra: (x @ W).sum(1) = x @ W.sum(1): a row reduction of W and a matrix-vector product instead of a 1.1 TFLOP GEMM."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, w):
        return torch.mv(x, w.sum(dim=1))
