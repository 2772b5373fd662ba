import os
import sys

import pytest
import torch

sys.path.insert(0, os.path.dirname(__file__))

requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
