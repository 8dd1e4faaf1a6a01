"""Small architecture: three conv3x3-ReLU-maxpool stages (3 -> 64 -> 128 -> 256), flatten (256 x 16 x 16), linear classifier to 1000 classes, float32, 128 images of 128 x 128."""
import torch
import torch.nn as nn
import torch.nn.functional as F

BATCH = 128
IMAGE = 128


class Model(nn.Module):
    def __init__(self, image, classes=1000):
        super().__init__()
        self.conv1 = nn.Conv2d(3, 64, 3, padding=1)
        self.conv2 = nn.Conv2d(64, 128, 3, padding=1)
        self.conv3 = nn.Conv2d(128, 256, 3, padding=1)
        self.fc = nn.Linear(256 * (image // 8) ** 2, classes)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv1(x)), 2)
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = F.max_pool2d(F.relu(self.conv3(x)), 2)
        return self.fc(x.flatten(1))


def get_inputs():
    return [torch.randn(BATCH, 3, IMAGE, IMAGE)]


def get_init_inputs():
    return [IMAGE]
