"""Small architecture: three-layer float32 MLP 2048 -> 4096 -> 4096 -> 1024 with ReLU, batch 8192 (481 GFLOP)."""
import torch
import torch.nn as nn

BATCH = 8192
IN_FEATURES = 2048
HIDDEN = 4096
OUT_FEATURES = 1024


class Model(nn.Module):
    def __init__(self, in_features, hidden, out_features):
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden), nn.ReLU(),
            nn.Linear(hidden, hidden), nn.ReLU(),
            nn.Linear(hidden, out_features),
        )

    def forward(self, x):
        return self.net(x)


def get_inputs():
    return [torch.randn(BATCH, IN_FEATURES) * 2.0]


def get_init_inputs():
    return [IN_FEATURES, HIDDEN, OUT_FEATURES]
