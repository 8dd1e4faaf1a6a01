"""A two-layer MLP (Linear, ReLU, Linear; KernelBench level 3's MLP pattern) on a small batch: its
weights (16 MiB) are the module's own, made in its constructor, and each call's input is 128 KiB.
The hack suite's task for work handed to the evaluator's build service
(tests/candidates/boundary/hack_service_*.py): the weights can be shipped once, and each call's
input is small."""
import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, d_in=512, d_hidden=4096, d_out=512):
        super().__init__()
        self.fc1 = nn.Linear(d_in, d_hidden)
        self.fc2 = nn.Linear(d_hidden, d_out)

    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))


def get_inputs():
    return [torch.randn(64, 512)]


def get_init_inputs():
    return [512, 4096, 512]
