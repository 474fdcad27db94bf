"""A bare timm `validate.py`-style eval, the baseline of benchmarks/test_eval_process.py: DeiT-Ti's
weights into timm's own model, timm's create_transform for its data config, torchvision's ImageFolder,
a DataLoader with 2 workers, fp32, top-1 counted. `python benchmarks/bare_eval.py VAL_FOLDER WEIGHTS`."""

import sys

import timm
import torch
from safetensors.torch import load_file
from timm.data import create_transform, resolve_data_config
from torchvision.datasets import ImageFolder

root, weights = sys.argv[1], sys.argv[2]
model = timm.create_model("deit_tiny_patch16_224", pretrained=False)
model.load_state_dict(load_file(weights))
model.eval()
transform = create_transform(**resolve_data_config({}, model=model))
loader = torch.utils.data.DataLoader(ImageFolder(root, transform), batch_size=64, num_workers=2)
correct = seen = 0
with torch.inference_mode():
    for x, y in loader:
        correct += int((model(x).argmax(1) == y).sum())
        seen += len(y)
print(f"bare: {seen} images, top-1 {100 * correct / seen:.2f}%")
