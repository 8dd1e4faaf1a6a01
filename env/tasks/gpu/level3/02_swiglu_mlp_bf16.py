"""Small architecture: LLaMA-style SwiGLU MLP w2(silu(w1 x) * w3 x), bfloat16, 8192 tokens, 4096 -> 8192 -> 4096 (1.6 TFLOP)."""
import torch
import torch.nn as nn
import torch.nn.functional as F

TOKENS = 8192
DIM = 4096
HIDDEN = 8192


class Model(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.w1 = nn.Linear(dim, hidden, bias=False)
        self.w3 = nn.Linear(dim, hidden, bias=False)
        self.w2 = nn.Linear(hidden, dim, bias=False)
        self.to(torch.bfloat16)

    def forward(self, x):
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


def get_inputs():
    return [torch.randn(TOKENS, DIM, dtype=torch.bfloat16)]


def get_init_inputs():
    return [DIM, HIDDEN]
