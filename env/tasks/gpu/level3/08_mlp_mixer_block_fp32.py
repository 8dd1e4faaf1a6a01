"""Small architecture: MLP-Mixer block (LayerNorm, token-mixing MLP over 256 tokens, LayerNorm, channel-mixing MLP 512 -> 2048 -> 512, GELU, residuals), float32, batch 128."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 128
TOKENS = 256
CHANNELS = 512
TOKEN_HIDDEN = 256
CHANNEL_HIDDEN = 2048


class Model(nn.Module):
    def __init__(self, tokens, channels, token_hidden, channel_hidden):
        super().__init__()
        self.norm1 = nn.LayerNorm(channels)
        self.tok1 = nn.Linear(tokens, token_hidden)
        self.tok2 = nn.Linear(token_hidden, tokens)
        self.norm2 = nn.LayerNorm(channels)
        self.ch1 = nn.Linear(channels, channel_hidden)
        self.ch2 = nn.Linear(channel_hidden, channels)

    def forward(self, x):
        y = self.norm1(x).transpose(1, 2)
        y = self.tok2(F.gelu(self.tok1(y))).transpose(1, 2)
        x = x + y
        return x + self.ch2(F.gelu(self.ch1(self.norm2(x))))


def get_inputs():
    return [torch.randn(BATCH, TOKENS, CHANNELS)]


def get_init_inputs():
    return [TOKENS, CHANNELS, TOKEN_HIDDEN, CHANNEL_HIDDEN]
