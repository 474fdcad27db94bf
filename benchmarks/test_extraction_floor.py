"""Extraction against the hardware (issue 46, goal 3): vitbench's feature extraction end to end from
JPEG files, DeiT-Ti and ViT-B/16 at 224 px, as a fraction of (a) a bare timm forward of the same
model and batch on random tensors already in memory and (b) this machine's dense matrix-product
FLOP/s over the model's FLOPs per image. It is `vitbench bench --mode inference`'s measurement
(its `real / bare` and `real / matmul peak` columns), on camera-sized JPEGs written here."""

import pytest
import torch
from gpu_runner import write_jpeg_folder

from vitbench.engine import bench
from vitbench.engine.bench_types import Config, Options


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    return write_jpeg_folder(tmp_path_factory.mktemp("floor"), 10, 96)  # 500x375 photo-like JPEGs


@pytest.mark.parametrize("model", ["deit-ti/16", "vit-b/16"])
def test_extraction_against_the_bare_forward_and_the_matmul_peak(benchmark, jpegs, model, capsys):
    quick = benchmark.disabled  # CI: runs once, tiny, to keep working; its figures mean nothing
    if quick and model != "deit-ti/16":
        pytest.skip("CI runs each benchmark once: DeiT-Ti shows it works (ViT-B/16 is the same path, 20 s more)")
    opts = bench.with_defaults(
        Options(
            batch=4 if quick else 16,
            steps=1 if quick else 2,
            warmup=1,
            precision="auto",
            compile=False,
            device=torch.device("cpu"),
            dataset=f"folder:{jpegs}",
            workers=1,
            modes=("inference",),
            rounds=1 if quick else 3,  # alternately, the median round kept (engine/bench.py)
        )
    )
    rows = {}

    def measure():
        for row in bench.measure_config(Config.parse(f"{model}@224"), opts):
            rows["real" if row.runner == "vitbench" and row.data != "synthetic" else row.runner + row.data] = row

    benchmark.group = f"extraction {model} @224 from JPEGs, against a bare forward and the matmul peak"
    benchmark.pedantic(measure, rounds=1, iterations=1)
    real, bare = rows["real"], rows["baresynthetic"]
    ratio = real.images_per_second / bare.images_per_second
    of_peak, bare_of_peak = real.notes["of_matmul_peak"], bare.notes["of_matmul_peak"]
    benchmark.extra_info.update(
        real_images_per_s=real.images_per_second,
        bare_images_per_s=bare.images_per_second,
        real_over_bare=ratio,
        real_of_matmul_peak=of_peak,
        bare_of_matmul_peak=bare_of_peak,
        matmul_peak_gflops=real.notes["matmul_peak_flops"] / 1e9,
    )
    with capsys.disabled():
        print(
            f"\n  {model} @224: real JPEGs {real.images_per_second:.1f} img/s, bare forward "
            f"{bare.images_per_second:.1f} img/s, real / bare {ratio:.2f}; of the matmul peak "
            f"({real.notes['matmul_peak_flops'] / 1e9:.0f} GFLOP/s): real {100 * of_peak:.1f} %, "
            f"bare {100 * bare_of_peak:.1f} %"
        )
    assert ratio > 0 and 0 < of_peak < 1.5
    if not quick and model == "vit-b/16":  # issue 46's goals, met on the 2-core CI machine (docs/performance.md)
        assert ratio >= 0.9 and of_peak >= 0.6
    # DeiT-Ti's are not: on 2 cores the bare forward keeps both busy, so decoding 500x375 JPEGs (about
    # 10 ms of a core each) has no idle core to hide on, and its 192-wide matmuls reach ~50 % of the peak
