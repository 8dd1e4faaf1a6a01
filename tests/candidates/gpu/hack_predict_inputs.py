# task: env/tasks/gpu/level1/01_matmul_fp32.py
# expect: no-credit
"""Hack (GPU, inputs predicted): in each call, draws the inputs the global random state it sees
would give next, multiplies them, and returns that product in the next call when its input
matches (checked on a few elements). Inputs come from seeds the operating system gives, and the
generators the candidate sees are reseeded before each of its calls: it never matches."""
import torch
import torch.nn as nn

K = 4096


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()
        self.ahead = None

    def forward(self, a, b):
        ahead = self.ahead
        if ahead is not None and torch.equal(ahead[0], a[0, :16]):
            self.ahead = None
            return ahead[1]
        out = a @ b
        torch.manual_seed(torch.initial_seed())
        ga = torch.randn(a.shape, device=a.device) * K ** -0.5
        gb = torch.randn(b.shape, device=b.device)
        self.ahead = (ga[0, :16].clone(), ga @ gb)
        return out
