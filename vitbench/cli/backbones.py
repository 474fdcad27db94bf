"""`vitbench inspect` (the paper's §4.5 figures of a backbone) and `vitbench weights` (what a
weights file holds, and its conversion to safetensors)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from vitbench import store
from vitbench.cli.app import app, err, out, print_table
from vitbench.cli.options import (
    DataDir,
    Device,
    Results,
    argument,
    check_data_dir,
    check_out_folder,
    in_panel,  # noqa: F401  (named by the text annotations @panels writes)
    option,
    panels,
)
from vitbench.cli.output import print_view

# Each command loads the model code (torch, timm) when it runs: `--help` never pays for it.


@app.command("inspect")
@panels(
    {
        "What to inspect": ("model", "weights", "res", "device"),
        "Images": ("images", "dataset", "data_dir", "num_images", "rollout_images"),
        "Output": ("out_dir", "results"),
    }
)
def inspect_cmd(
    model: Annotated[str, option("--model", "-m", help="A ViT or hybrid (`vitbench ls models`).")],
    weights: Annotated[str, option("--weights", "-w", help="A .npz/.safetensors/.pth file, timm:<tag>, or 'random'.")],
    images: Annotated[Path | None, option("--images", help="A folder of images.")] = None,
    dataset: Annotated[str | None, option("--dataset", "-d", help="Or: a dataset's test images.")] = None,
    data_dir: DataDir = None,
    res: Annotated[int | None, option("--res", help="Input resolution (position embeddings interpolated).")] = None,
    num_images: Annotated[int, option("--num-images", min=1, help="Images for the attention distances.")] = 32,
    rollout_images: Annotated[int, option("--rollout-images", min=0, help="Images to draw rollout maps for.")] = 8,
    out_dir: Annotated[Path, option("--out", help="Folder for the PNG files.")] = Path("inspect"),
    results: Results = Path("results"),
    device: Device = "auto",
) -> None:
    """Paper §4.5 views of a backbone: embedding filters, position similarity, attention distance, rollout."""
    from vitbench import api
    from vitbench.views.tables import attention

    found = api.inspect(
        model, weights, res=res, images=images, dataset=dataset, data_dir=check_data_dir(data_dir),
        out_dir=check_out_folder(out_dir),
        results=results, device=device, num_images=num_images, rollout_images=rollout_images,
    )  # fmt: skip
    print_view(attention.attention_view(store.read_attention_distance(results), only=found["inspect_key"]))
    written = ["embedding_filters.png"] if found["filters_written"] else []
    written += [
        "position_similarity.png",
        "attention_distance.png",
        f"attention_rollout/ ({len(found['rollout_files'])} images)",
    ]
    if not found["filters_written"]:
        err.print("embedding filters skipped: a hybrid's patch embedding projects ResNet features, not RGB patches")
    out.print(f"wrote {', '.join(written)} under {out_dir}; attention distances stored in {results / store.DB_NAME}")


weights_app = typer.Typer(help="Inspect and convert weights files.", no_args_is_help=True)
app.add_typer(weights_app, name="weights")


@weights_app.command("inspect")
def weights_inspect(path: Annotated[Path, argument(help="A .npz, .safetensors or .pth file.")]) -> None:
    """Format, inferred architecture, parameters, patch/grid/width/depth/heads, head, pre_logits."""
    from vitbench.weights.describe import describe

    t = Table("field", "value", show_header=False)
    for key, value in describe(path).items():
        t.add_row(key, str(value))
    print_table(t)


@weights_app.command("convert")
def weights_convert(
    path: Annotated[Path, argument(help="A Google .npz checkpoint.")],
    output: Annotated[Path, argument(help="The .safetensors file to write.")],
    model: Annotated[str | None, option("--model", "-m", help="Architecture, if it cannot be inferred.")] = None,
) -> None:
    """Convert a Google .npz once into safetensors (every tensor checked), keeping pre_logits."""
    from vitbench.weights.describe import convert

    name = convert(path, model, output)
    out.print(f"wrote {output} ({name})")
