"""PyTorch: scale and causal mask applied inside one baddbmm (an additive -inf bias, alpha = 1/sqrt(d)), softmax in place: two fewer passes over the scores."""
import math

import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, q, k, v):
        b, h, s, d = q.shape
        bias = torch.full((s, s), float("-inf"), dtype=q.dtype, device=q.device).triu_(1)
        scores = torch.baddbmm(bias.expand(b * h, s, s), q.reshape(b * h, s, d),
                               k.reshape(b * h, s, d).transpose(1, 2), beta=1.0, alpha=1.0 / math.sqrt(d))
        p = torch.softmax(scores, dim=-1)
        return torch.bmm(p, v.reshape(b * h, s, d)).view(b, h, s, d)
