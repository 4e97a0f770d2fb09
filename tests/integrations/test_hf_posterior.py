"""The posterior travels with the model (issue 46, item 4): ``VariationalTrainer.save_model`` writes
``posterior.safetensors`` beside the weights, and ``load_with_posterior`` in a fresh process gives back the
model and a sampler whose predictive is the trainer's, draw for draw.

A tiny GPT-2 built from a config (nothing downloaded), trained a few IVON steps, once with LoRA adapters
(PEFT) and once in full. The reference predictive is computed in this process from the trained model and the
optimizer's posterior (``ngvi.PosteriorSampler`` with the same seed); the child process loads only the saved
folders. Same weights, same posterior, same seeded draws: the outputs agree to float32 round-off.
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import ngvi

transformers = pytest.importorskip("transformers")
peft = pytest.importorskip("peft")
pytest.importorskip("safetensors")
from transformers import GPT2Config, GPT2LMHeadModel, TrainingArguments  # noqa: E402

from ngvi.integrations.hf import POSTERIOR_FILE, VariationalTrainer, load_with_posterior  # noqa: E402

#: transformers' own deprecation notes inside save/load, not ngvi's
pytestmark = pytest.mark.filterwarnings("ignore:`is_gradient_checkpointing` is deprecated:FutureWarning")
transformers.logging.set_verbosity_error()
logging.getLogger("transformers").setLevel(logging.ERROR)

REPO = Path(__file__).resolve().parents[2]
TEXT = "in the beginning god created the heaven and the earth. and the earth was without form, and void. " * 6
CHARS = sorted(set(TEXT))
T, N, SAMPLES, SEED = 16, 32, 4, 7
SEQS = torch.tensor([CHARS.index(c) for c in TEXT])[: N * T].view(N, T)
X = SEQS[:3]


class Data(torch.utils.data.Dataset):
    def __len__(self) -> int:
        return N

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": SEQS[i], "labels": SEQS[i]}


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=1, n_embd=16, n_head=2, vocab_size=len(CHARS), n_positions=T, bos_token_id=0, eos_token_id=0
    )
    return GPT2LMHeadModel(config)


def train(model: torch.nn.Module, out: Path) -> VariationalTrainer:
    opt = ngvi.IVON(model.parameters(), data_size=N * (T - 1), lr=0.05, hess_init=0.1, seed=0)
    args = TrainingArguments(
        str(out), per_device_train_batch_size=8, max_steps=3, report_to=[], save_strategy="no", use_cpu=True,
        disable_tqdm=True, dataloader_num_workers=0, logging_strategy="no", lr_scheduler_type="constant",
    )  # fmt: skip
    trainer = VariationalTrainer(model=model, args=args, train_dataset=Data(), optimizers=(opt, None))
    trainer.train()
    return trainer


def reference(trainer: VariationalTrainer) -> dict[str, torch.Tensor]:
    """The trained model's predictive in this process: the mean weights and SAMPLES seeded draws."""
    post = ngvi.posterior_of(trainer.model, trainer.ngvi_optimizer)
    sampler = ngvi.PosteriorSampler(trainer.model, post, seed=SEED)
    x = {"input_ids": X}
    return {
        "mean": ngvi.predict(trainer.model, sampler, x, samples=0),
        "draws": ngvi.predict(trainer.model, sampler, x, samples=SAMPLES),
        "variance": torch.cat([v.flatten() for v in post.variance]),
    }


CHILD = f"""
import sys, torch, ngvi
from transformers import GPT2LMHeadModel
from ngvi.integrations.hf import load_with_posterior
folder, base, out = sys.argv[1], sys.argv[2], sys.argv[3]
model = GPT2LMHeadModel.from_pretrained(base) if base != "-" else None
loaded = load_with_posterior(folder, model=model, seed={SEED})
x = {{"input_ids": torch.load(out + ".x", weights_only=True)}}
torch.save({{
    "mean": ngvi.predict(loaded.model, loaded.sampler, x, samples=0),
    "draws": ngvi.predict(loaded.model, loaded.sampler, x, samples={SAMPLES}),
    "variance": torch.cat([v.flatten() for v in loaded.posterior.variance]),
    "rule": loaded.posterior.rule,
    "trainable": sorted(n for n, p in loaded.model.named_parameters() if p.requires_grad),
}}, out)
"""


def in_fresh_process(folder: Path, base: Path | None, tmp_path: Path) -> dict:
    out = tmp_path / "child.pt"
    torch.save(X, str(out) + ".x")
    result = subprocess.run(
        [sys.executable, "-c", CHILD, str(folder), str(base) if base else "-", str(out)],
        capture_output=True, text=True, timeout=300, cwd=tmp_path,
        env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return torch.load(out, weights_only=True)


def assert_same_predictive(ours: dict, theirs: dict) -> None:
    assert theirs["rule"] == "IVON"
    torch.testing.assert_close(theirs["variance"], ours["variance"], rtol=0, atol=0)  # the file is exact
    # same weights and the same seeded draws; float32 forward passes in two processes
    torch.testing.assert_close(theirs["mean"], ours["mean"], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(theirs["draws"], ours["draws"], rtol=1e-5, atol=1e-6)
    assert ours["draws"].shape == (SAMPLES, len(X), T, len(CHARS))
    assert (ours["draws"] - ours["mean"]).abs().amax() > 1e-4  # the draws differ from the mean: a real test


def test_lora_adapter_and_posterior_load_in_a_fresh_process(tmp_path):
    base = gpt2()
    base.save_pretrained(tmp_path / "base")  # what the user starts from (here: built from a config)
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
    trainer = train(model, tmp_path / "run")
    trainer.save_model(str(tmp_path / "adapter"))
    files = {p.name for p in (tmp_path / "adapter").iterdir()}
    assert {"adapter_config.json", "adapter_model.safetensors", POSTERIOR_FILE} <= files
    from safetensors import safe_open

    with safe_open(str(tmp_path / "adapter" / POSTERIOR_FILE), "pt") as f:
        names = json.loads(f.metadata()["names"])
    assert names and all("lora_" in n for n in names)  # the adapters' posterior, not the frozen base
    theirs = in_fresh_process(tmp_path / "adapter", tmp_path / "base", tmp_path)
    assert theirs["trainable"] == sorted(names)
    assert_same_predictive(reference(trainer), theirs)


def test_full_model_and_posterior_load_in_a_fresh_process(tmp_path):
    trainer = train(gpt2(), tmp_path / "run")
    trainer.save_model(str(tmp_path / "full"))
    assert (tmp_path / "full" / "config.json").is_file() and (tmp_path / "full" / POSTERIOR_FILE).is_file()
    assert_same_predictive(reference(trainer), in_fresh_process(tmp_path / "full", None, tmp_path))


def test_checkpoints_carry_the_posterior(tmp_path):
    model = gpt2()
    opt = ngvi.IVON(model.parameters(), data_size=N * (T - 1), lr=0.05, seed=0)
    args = TrainingArguments(
        str(tmp_path), per_device_train_batch_size=8, max_steps=2, save_strategy="steps", save_steps=2,
        report_to=[], use_cpu=True, disable_tqdm=True, logging_strategy="no",
    )  # fmt: skip
    VariationalTrainer(model=model, args=args, train_dataset=Data(), optimizers=(opt, None)).train()
    saved = ngvi.load_posterior(tmp_path / "checkpoint-2" / POSTERIOR_FILE, model=model)
    for a, b in zip(saved.variance, opt.posterior().variance, strict=True):
        assert torch.equal(a, b)


@pytest.mark.filterwarnings("ignore:Found missing adapter keys:UserWarning")  # PEFT's, on the wrong base
def test_loading_refuses_what_it_cannot_pair(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"has no posterior\.safetensors"):
        load_with_posterior(tmp_path)
    base = gpt2()
    model = peft.get_peft_model(base, peft.LoraConfig(r=4, target_modules=["c_attn"], fan_in_fan_out=True))
    train(model, tmp_path / "run").save_model(str(tmp_path / "adapter"))
    with pytest.raises(ValueError, match="holds a PEFT adapter: pass the base model"):
        load_with_posterior(tmp_path / "adapter")
    other = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=16, n_head=2, vocab_size=len(CHARS), n_positions=T))
    with pytest.raises(ValueError, match=r"does not match the model"):
        load_with_posterior(tmp_path / "adapter", model=other)  # another base: the LoRA names differ
