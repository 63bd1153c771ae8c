"""A training script (the anchors' torch_train.py, benches/reference/fashion_ddp.py) with DDP's own
gradient compression: every DistributedDataParallel it makes registers PyTorch's
`fp16_compress_hook` (gradients cast to float16 for the all-reduce,
the result cast back), the comparison DDP offers to Lockstep's 16-bit gradients.

Usage: python3 benches/torch_train_fp16_hook.py PATH/TO/SCRIPT.py [its arguments...]
"""

import os
import runpy
import sys

import torch.nn as nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks


class Fp16CompressedDDP(nn.parallel.DistributedDataParallel):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.register_comm_hook(state=None, hook=default_hooks.fp16_compress_hook)


# torch_train.py looks the class up when it wraps its model, after this runs.
nn.parallel.DistributedDataParallel = Fp16CompressedDDP
script = sys.argv[1]
sys.argv = sys.argv[1:]
# As `python3 SCRIPT` would: the script's folder first on the import path.
sys.path.insert(0, os.path.dirname(os.path.abspath(script)))
runpy.run_path(script, run_name="__main__")
