"""`ngvi classify` and its parts: a tiny MNIST run per optimizer through the CLI, the CIFAR-10 loader (its
pickle reader: test_cifar_pickle.py), the Fashion-MNIST message, rotation, and the CIFAR-10 models on
synthetic tensors."""

from __future__ import annotations

import json
import pickle

import numpy as np
import pytest
import torch

from ngvi.experiments.cli import main
from ngvi.experiments.data import DataNotFoundError
from ngvi.experiments.data._safe_pickle import loads
from ngvi.experiments.data.cifar10 import load_cifar10
from ngvi.experiments.data.fashion_mnist import DEBIAN_DIR, load_fashion_mnist
from ngvi.experiments.vision import experiment, models
from ngvi.experiments.vision.transforms import flip_crop, random_shift, rotate

MNIST = "mnist/t10k-images-idx3-ubyte.gz"
HAS_FASHION = (DEBIAN_DIR / "t10k-images-idx3-ubyte.gz").is_file()


@pytest.mark.data(MNIST)
def test_tiny_mnist_run_per_optimizer(tmp_path, data_dir):
    """Every optimizer trains LeNet-5 for a few steps and is evaluated (BMA and mean weights, shift curve);
    the metrics are finite and consistent, and the report is written."""
    out = tmp_path / "classify"
    args = [
        "classify",
        "--quick",
        "--no-ood",
        "--out",
        str(out),
        "--jobs",
        "2",
        "--data-dir",
        str(data_dir),
    ]
    assert main(args) == 0
    results = json.loads((out / "results.json").read_text())
    runs = results["runs"]
    assert set(runs) == set(experiment.default_methods())
    for name, r in runs.items():
        for kind in ("bma", "mean"):
            m = r[kind]
            assert 0 <= m["accuracy"] <= 1 and 0 <= m["ece"] <= 1 and 0 <= m["brier"] <= 2, name
            assert np.isfinite(m["nll"]) and m["nll"] > 0, name
            assert sum(r["reliability"][kind]["count"]) == experiment.QUICK["test_size"]
        assert len(r["shift"]["bma"]["accuracy"]) == len(experiment.QUICK["angles"])
    assert runs["map"]["bma"] == runs["map"]["mean"]  # a point estimate: one network
    table = (out / "table.md").read_text()
    assert "| Noisy K-FAC |" in table and "NNG's pattern" in table
    for png in ("reliability.png", "shift.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.data(MNIST)
@pytest.mark.skipif(not HAS_FASHION, reason="needs Debian's dataset-fashion-mnist")
def test_out_of_distribution_part(tmp_path, data_dir):
    out = tmp_path / "ood"
    args = ["classify", "--quick", "--methods", "ivon", "--out", str(out), "--jobs", "1"]
    assert main([*args, "--data-dir", str(data_dir)]) == 0
    r = json.loads((out / "results.json").read_text())["runs"]["ivon"]
    assert (
        0 <= r["bma"]["ood_auroc"] <= 1 and sum(r["entropy_hist"]["ood_bma"]) == experiment.QUICK["ood_size"]
    )
    assert (out / "entropy.png").is_file()


def test_missing_fashion_mnist_says_how_to_install(tmp_path, capsys):
    with pytest.raises(DataNotFoundError, match="apt-get install -y dataset-fashion-mnist"):
        load_fashion_mnist("test", tmp_path)
    # the CLI says it in one line, before training anything
    code = main(
        ["classify", "--quick", "--ood-dir", str(tmp_path), "--out", str(tmp_path / "o"), "--jobs", "1"]
    )
    assert code == 2 and "Fashion-MNIST file" in capsys.readouterr().err
    assert not (tmp_path / "o" / "results.json").exists()


def write_cifar(folder, n: int = 4, protocol: int = 2):
    """Batches shaped like the python-version CIFAR-10 files (Python 2 pickles have bytes keys)."""
    folder.mkdir()
    rng = np.random.default_rng(0)
    for name in (*(f"data_batch_{i}" for i in range(1, 6)), "test_batch"):
        batch = {
            b"batch_label": name.encode(),
            b"labels": rng.integers(0, 10, n).tolist(),
            b"data": rng.integers(0, 256, (n, 3072), dtype=np.uint8),
            b"filenames": [f"{name}_{i}.png".encode() for i in range(n)],
        }
        (folder / name).write_bytes(pickle.dumps(batch, protocol=protocol))


@pytest.mark.parametrize("protocol", [2, 5])
def test_cifar10_batches_load(tmp_path, protocol):
    write_cifar(tmp_path / "cifar-10-batches-py", protocol=protocol)
    x, y = load_cifar10(tmp_path / "cifar-10-batches-py", "train")
    assert x.shape == (20, 3, 32, 32) and x.dtype == torch.uint8 and y.shape == (20,)
    raw = loads((tmp_path / "cifar-10-batches-py" / "data_batch_1").read_bytes(), "data_batch_1")
    assert torch.equal(x[0].reshape(-1), torch.from_numpy(raw[b"data"][0]))  # planes R, G, B, row-major
    x_test, _ = load_cifar10(tmp_path / "cifar-10-batches-py", "test")
    assert x_test.shape == (4, 3, 32, 32)
    with pytest.raises(DataNotFoundError, match="cifar-10-batches-py"):
        load_cifar10(tmp_path / "nowhere", "test")


def test_cifar10_run_on_synthetic_batches(tmp_path):
    """The CIFAR-10 path end to end (ResNet-20 with batch norm under noisy K-FAC), on synthetic batches."""
    write_cifar(tmp_path / "batches", n=8)
    out = tmp_path / "cifar"
    args = ["classify", "--quick", "--dataset", "cifar10", "--model", "resnet20", "--cifar-dir",
            str(tmp_path / "batches"), "--methods", "noisy_kfac", "--angles", "0", "--augment", "flip-crop",
            "--test-samples", "2", "--out", str(out), "--jobs", "1"]  # fmt: skip
    assert main(args) == 0
    runs = json.loads((out / "results.json").read_text())["runs"]
    assert sum(runs["noisy_kfac"]["reliability"]["bma"]["count"]) == 8  # the synthetic test batch


def test_rotation_and_augmentations():
    x = torch.arange(2 * 7 * 7, dtype=torch.float32).reshape(2, 1, 7, 7)
    torch.testing.assert_close(rotate(x, 90), torch.rot90(x, 1, dims=(-2, -1)), atol=1e-4, rtol=0)
    torch.testing.assert_close(rotate(x, -180), torch.rot90(x, 2, dims=(-2, -1)), atol=1e-4, rtol=0)
    assert torch.equal(rotate(x, 0), x)
    gen = torch.Generator().manual_seed(0)
    shifted = random_shift(2)(x, gen)
    assert shifted.shape == x.shape and shifted.sum() <= x.sum()
    assert flip_crop(4)(torch.randn(3, 3, 32, 32), gen).shape == (3, 3, 32, 32)


def test_cifar_models_on_synthetic_tensors():
    x = torch.randn(2, 3, 32, 32)
    vgg = models.vgg16_half()
    convs = [m.out_channels for m in vgg.modules() if isinstance(m, torch.nn.Conv2d)]
    assert convs == [c for c in models.VGG16_HALF if c != "M"]  # NNG's 32-32-M-...-256-M-FC10
    assert vgg(x).shape == (2, 10)
    resnet = models.resnet20()
    convs = [m for m in resnet.modules() if isinstance(m, torch.nn.Conv2d)]
    assert len(convs) == 19 and resnet(x).shape == (2, 10)  # 19 convolutions + 1 Linear = 20 layers
    assert sum(p.numel() for p in resnet.parameters()) == pytest.approx(0.27e6, rel=0.01)


def test_report_reads_the_bins_from_the_results_not_from_the_experiment(tmp_path):
    """The report module takes everything from the run's results (it imports nothing of the experiment):
    a run binned into 10 reliability bins and 6 entropy bins is reported as such."""
    from ngvi.experiments.vision import report

    metrics = {"accuracy": 0.5, "nll": 0.7, "ece": 0.1, "brier": 0.6, "ood_auroc": 0.8}
    rel = {"accuracy": [0.5] * 10, "confidence": [0.55] * 10, "count": [1] * 10}
    run = {
        "bma": metrics, "mean": metrics, "train_seconds": 1.0,
        "reliability": {"bma": rel, "mean": rel}, "entropy_hist": {"in_bma": [1] * 6, "ood_bma": [2] * 6},
    }  # fmt: skip
    config = {
        "ood": True, "train_size": 100, "dataset": "mnist", "model": "cnn", "batch_norm": False, "epochs": 1,
        "batch_size": 32, "seed": 0, "test_samples": 4,
    }  # fmt: skip
    assert "ECE with 10 equal-width bins" in report.table({"ivon": run}, config)
    report.reliability_figure({"ivon": run}, tmp_path / "reliability.png")
    report.entropy_figure({"ivon": run}, tmp_path / "entropy.png")
    assert (tmp_path / "entropy.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
