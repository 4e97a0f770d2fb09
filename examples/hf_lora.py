"""LoRA fine-tuning with IVON under the Hugging Face Trainer; its token-level predictive against AdamW-LoRA.

1. A small character-level GPT-2, built from a config (nothing is downloaded), is pre-trained briefly with
   AdamW on the first part of a text: ``$NGVI_DATA/text/kjv.txt`` (the King James Bible) when present,
   else a short built-in text.
2. LoRA adapters (PEFT) on its attention are fine-tuned on a later part of the text, once with IVON through
   ``ngvi.integrations.hf.VariationalTrainer`` and once with AdamW (the stock Trainer).
3. Both are evaluated on held-out text, per token: NLL and ECE of IVON's Bayesian model average over
   ``--samples`` draws (``ngvi.evaluate_classifier``), of IVON's mean weights, and of AdamW.

``data_size`` is the number of *tokens* of the fine-tuning set, because the Trainer's loss is a token mean
(docs/CHOOSING.md, "Language models and LoRA"). ``--quick`` (CI) runs a few steps in well under a minute.
It trains on the accelerator when there is one (the Trainer's choice: CUDA, ...) and on the CPU otherwise;
``--cpu`` keeps it on the CPU.

    python examples/hf_lora.py [--quick] [--cpu] [--text PATH]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments
from transformers import logging as hf_logging

import ngvi
from ngvi.integrations.hf import VariationalTrainer, next_token_labels

# the benchmark data folder, as the experiments find it (README: "point NGVI_DATA at it")
KJV = Path(os.environ.get("NGVI_DATA", "../shared/data")) / "text" / "kjv.txt"
BUILTIN = (
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. "
    "And God said, Let there be light: and there was light. And God saw the light, that it was good: "
    "and God divided the light from the darkness. And God called the light Day, and the darkness he "
    "called Night. And the evening and the morning were the first day. "
) * 40


class Sequences(torch.utils.data.Dataset):
    def __init__(self, seqs: torch.Tensor) -> None:
        self.seqs = seqs

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.seqs[i], "labels": self.seqs[i]}


def load_text(path: Path | None, chars: int) -> str:
    path = path or (KJV if KJV.exists() else None)
    text = path.read_text(errors="ignore") if path else BUILTIN
    return " ".join(text.split())[:chars]  # one space for any run of white space


def arguments(out: str, steps: int, batch: int, lr: float, cpu: bool) -> TrainingArguments:
    return TrainingArguments(
        out, max_steps=steps, per_device_train_batch_size=batch, learning_rate=lr, report_to=[],
        save_strategy="no", use_cpu=cpu, disable_tqdm=True, dataloader_num_workers=0, logging_strategy="no",
        lr_scheduler_type="constant", seed=0,
    )  # fmt: skip


def lora(base: GPT2LMHeadModel):
    import peft

    config = peft.LoraConfig(r=8, lora_alpha=16, target_modules=["c_attn", "c_proj"], fan_in_fan_out=True)
    return peft.get_peft_model(base, config)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a few steps (CI)")
    parser.add_argument("--text", type=Path, default=None)
    parser.add_argument("--samples", type=int, default=16)
    parser.add_argument("--cpu", action="store_true", help="train on the CPU even where an accelerator is")
    args = parser.parse_args()
    hf_logging.set_verbosity_error()
    torch.manual_seed(0)
    t0 = time.time()
    seq, batch = 32, 16
    pre_steps, tune_steps, width = (60, 40, 32) if args.quick else (1500, 300, 64)
    text = load_text(args.text, 60_000 if args.quick else 2_000_000)
    chars = sorted(set(text))
    ids = torch.tensor([chars.index(c) for c in text])
    seqs = ids[: len(ids) // seq * seq].view(-1, seq)
    n = len(seqs)
    pre, tune, test = seqs[: n // 2], seqs[n // 2 : n // 2 + n // 4], seqs[n // 2 + n // 4 :][:256]

    config = GPT2Config(n_layer=2, n_embd=width, n_head=4, vocab_size=len(chars), n_positions=seq)
    config.bos_token_id = config.eos_token_id = 0  # inside this vocabulary
    base = GPT2LMHeadModel(config)
    out = tempfile.mkdtemp()
    pretrain = arguments(out, pre_steps, batch, 3e-3, args.cpu)
    device = pretrain.device  # the accelerator when there is one (and --cpu is not given), else the CPU
    Trainer(model=base, args=pretrain, train_dataset=Sequences(pre)).train()
    state = {k: v.clone() for k, v in base.state_dict().items()}

    # IVON-LoRA: N = tokens of the fine-tuning set (the loss is a token mean); σ₀ = 1/√(N·(h₀ + δ))
    model = lora(base)
    tokens = tune[:, 1:].numel()
    opt = ngvi.IVON(model.parameters(), data_size=tokens, lr=0.05, hess_init=0.1, seed=0)
    trainer = VariationalTrainer(
        model=model, args=arguments(out, tune_steps, batch, 0.05, args.cpu), train_dataset=Sequences(tune),
        optimizers=(opt, None), eval_samples=args.samples,
    )  # fmt: skip
    trainer.train()

    x = {"input_ids": test.to(device)}  # the Trainer moved the model to `device`
    y = next_token_labels(test).to(device)
    ivon = ngvi.evaluate_classifier(model, trainer.optimizer, x, y, samples=args.samples, batch_size=64)

    twin = GPT2LMHeadModel(config)
    twin.load_state_dict(state)  # the same pre-trained network for the AdamW adapters
    adamw_model = lora(twin)
    adamw_args = arguments(out, tune_steps, batch, 3e-3, args.cpu)
    Trainer(model=adamw_model, args=adamw_args, train_dataset=Sequences(tune)).train()
    point = ngvi.baselines.MAP(adamw_model.parameters(), tokens)  # AdamW's weights, evaluated as they are
    adamw = ngvi.evaluate_classifier(adamw_model, point, x, y, samples=1)

    print(f"device: {device}")
    print(f"text: {len(text)} characters, vocabulary {len(chars)}; fine-tuning data_size = {tokens} tokens")
    sigma = torch.cat([v.flatten() for v in trainer.posterior().variance]).sqrt()
    print(f"sigma after fine-tuning: median {float(sigma.median()):.4f}")
    print(f"{'':18s} {'NLL/token':>10s} {'ECE':>8s} {'accuracy':>9s}")
    rows = [("IVON-LoRA (BMA)", ivon.bma), ("IVON-LoRA (mean)", ivon.mean), ("AdamW-LoRA", adamw.mean)]
    for name, m in rows:
        print(f"{name:18s} {m['nll']:10.4f} {m['ece']:8.4f} {m['accuracy']:9.4f}")
    print(f"({time.time() - t0:.1f} s)")


if __name__ == "__main__":
    main()
