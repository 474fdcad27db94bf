"""BiT ResNets (Kolesnikov et al. 2020): timm's pre-activation ResNetV2 with weight-standardised convs.

Few-shot representation: the globally average-pooled features after the final GroupNorm+ReLU,
i.e. what feeds BiT's 1x1-conv head.
"""

from vitbench.plugin import Backend, ModelSpec


class BiTBackend(Backend):
    family = "bit"
    representation = "GAP(GN+ReLU)"
    channels_last = True
    resnet_baseline = True  # the paper's ResNet baselines (App. B.1.1)

    def fits_npz(self, spec, model, shapes) -> bool:
        """big_transfer's layout: a root block, then units per stage."""
        if "root_block/standardized_conv2d/kernel" not in shapes:
            return False
        units = [len({k.split("/")[1] for k in shapes if k.startswith(f"block{b}/")}) for b in range(1, 5)]
        return (
            model.stem.conv.weight.shape[0] == shapes["root_block/standardized_conv2d/kernel"][-1]
            and [len(stage.blocks) for stage in model.stages] == units
        )


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
