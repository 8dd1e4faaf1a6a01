"""WRONG: reads the gates in the order i, f, o, g instead of PyTorch's i, f, g, o."""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.cell = nn.LSTMCell(input_size, hidden_size)

    def forward(self, x, h0, c0):
        h, c = h0, c0
        outs = []
        for t in range(x.shape[0]):
            gates = x[t] @ self.cell.weight_ih.t() + self.cell.bias_ih + h @ self.cell.weight_hh.t() + self.cell.bias_hh
            i, f, o, g = gates.chunk(4, dim=1)
            c = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
            h = torch.sigmoid(o) * torch.tanh(c)
            outs.append(h)
        return torch.stack(outs)
