"""A recurrent cell that keeps its hidden state between calls, as KernelBench's level 3 VanillaRNN
tasks do: forward updates self.hidden, so two calls on the same inputs give different outputs.
No candidate can be judged against such a reference: the evaluator says so (runtime_error naming
the reference) instead of calling a faithful candidate incorrect or not deterministic."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, input_size, hidden_size):
        super().__init__()
        self.hidden = torch.randn(16, hidden_size)
        self.i2h = nn.Linear(input_size + hidden_size, hidden_size)

    def forward(self, x):
        self.hidden = self.hidden.to(x.device)
        self.hidden = torch.tanh(self.i2h(torch.cat((x, self.hidden), dim=1)))
        return self.hidden


def get_inputs():
    return [torch.randn(16, 64)]


def get_init_inputs():
    return [64, 128]
