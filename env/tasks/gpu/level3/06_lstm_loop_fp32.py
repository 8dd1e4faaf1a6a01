"""Small architecture: single-layer LSTM unrolled with nn.LSTMCell over 256 steps, float32, batch 64, 1024 -> 1024; returns every hidden state."""
import torch
import torch.nn as nn

STEPS = 256
BATCH = 64
INPUT = 1024
HIDDEN = 1024


class Model(nn.Module):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.cell = nn.LSTMCell(input_size, hidden_size)

    def forward(self, x, h0, c0):
        h, c = h0, c0
        outs = []
        for t in range(x.shape[0]):
            h, c = self.cell(x[t], (h, c))
            outs.append(h)
        return torch.stack(outs)


def get_inputs():
    return [torch.randn(STEPS, BATCH, INPUT), 0.5 * torch.randn(BATCH, HIDDEN), 0.5 * torch.randn(BATCH, HIDDEN)]


def get_init_inputs():
    return [INPUT, HIDDEN]
