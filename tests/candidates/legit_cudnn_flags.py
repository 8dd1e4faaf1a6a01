# task: tests/tasks/cudnn_flag_probe.py
# expect: ok
"""Legitimate: sets backend settings for itself, through attributes and a switch
(torch.backends.cudnn.benchmark and .deterministic, TF32 for cuBLAS and cuDNN, fp32_precision
for oneDNN's matmul, the flash attention backend off; refused on sight before), and computes
what the reference computes under the harness's settings. Its forward sees its own settings:
it checks them, so a worker that dropped them would fail it. Where they change precision, the
outputs' error judges them (the probe's forward does no matmul)."""
import torch
import torch.nn as nn

torch.backends.cudnn.benchmark = True
torch.backends.cudnn.deterministic = True
torch.backends.cuda.matmul.allow_tf32 = True
torch.backends.cudnn.allow_tf32 = True
torch.backends.mkldnn.matmul.fp32_precision = "tf32"
torch.backends.cuda.enable_flash_sdp(False)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x):
        if not (torch.backends.cudnn.benchmark and torch.backends.cudnn.deterministic
                and torch.backends.cuda.matmul.allow_tf32 and torch.backends.cudnn.allow_tf32
                and torch.backends.mkldnn.matmul.fp32_precision == "tf32"
                and not torch.backends.cuda.flash_sdp_enabled()):
            raise RuntimeError("the candidate's own cudnn settings are not in force in its call")
        return x * 1.0
