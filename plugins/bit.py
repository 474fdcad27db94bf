"""BiT ResNets (Kolesnikov et al. 2020): timm's pre-activation ResNetV2 with weight-standardised convs.

Few-shot representation: the globally average-pooled features after the final GroupNorm+ReLU,
i.e. what feeds BiT's 1x1-conv head.
"""

from vitbench.backend import Backend, ModelSpec


class BiTBackend(Backend):
    family = "bit"
    representation = "GAP(GN+ReLU)"


BACKEND = BiTBackend()

MODELS = [
    ModelSpec(
        f"bit-m-r{depth}x{width}",
        f"resnetv2_{depth}x{width}_bit",
        BACKEND,
        summary=f"BiT-M ResNet-{depth}x{width} (ImageNet-21k upstream)",
    )
    for depth, width in [(50, 1), (50, 3), (101, 1), (101, 3), (152, 2), (152, 4)]
]
