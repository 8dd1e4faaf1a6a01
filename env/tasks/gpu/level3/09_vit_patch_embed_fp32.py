"""Small architecture: ViT patch embedding (16x16 patches cut by reshape/permute, linear 768 -> 768, position embedding, LayerNorm), float32, 256 images of 3 x 256 x 256."""
import torch
import torch.nn as nn

BATCH = 256
IMAGE = 256
PATCH = 16
DIM = 768


class Model(nn.Module):
    def __init__(self, image, patch, dim):
        super().__init__()
        self.patch = patch
        self.proj = nn.Linear(3 * patch * patch, dim)
        self.pos = nn.Parameter(0.5 * torch.randn((image // patch) ** 2, dim))
        self.norm = nn.LayerNorm(dim)

    def forward(self, img):
        b, c, h, w = img.shape
        p = self.patch
        x = img.reshape(b, c, h // p, p, w // p, p).permute(0, 2, 4, 1, 3, 5)
        x = x.reshape(b, (h // p) * (w // p), c * p * p)
        return self.norm(self.proj(x) + self.pos)


def get_inputs():
    return [torch.randn(BATCH, 3, IMAGE, IMAGE)]


def get_init_inputs():
    return [IMAGE, PATCH, DIM]
