"""Let PyPI's torchvision import beside the CPU build of torch, in the vLLM test environment only.

PyPI has no CPU build of torchvision for x86_64: its wheel's compiled ops link CUDA libraries that
the CPU torch lacks, so they do not load, and torchvision then fails at import when it registers
fake kernels for two ops that nothing defined ("operator torchvision::nms does not exist").
vLLM's Qwen3-VL processor needs only torchvision's Python image transforms, never these ops, so
this defines their schemas (the same as torchvision's own) before torchvision is imported. The
folder is put on PYTHONPATH for the test's vLLM processes; nothing in site-packages is changed.
A call of the ops would fail loudly (no kernel), never compute something wrong.
"""

import importlib.util

if importlib.util.find_spec("torch") is not None:
    import torch

    _lib = torch.library.Library("torchvision", "DEF")
    for _op in ("nms", "qnms"):
        _lib.define(f"{_op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")
