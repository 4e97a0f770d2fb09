"""The Hugging Face integration's edges (issue 31, items 12-16): weight decay on every path, a resume whose
hyperparameters differ from the checkpoint's, a second NGVICallback, the trainers that take the model, and
next_token_labels' dtype. The tiny GPT-2 and its data are test_hf.py's."""

from __future__ import annotations

import pytest
import torch

pytest.importorskip("transformers")
pytest.importorskip("peft")

from test_hf import CHARS, SEQS

from ngvi.integrations.hf import next_token_labels

pytestmark = pytest.mark.filterwarnings("ignore:There is a performance drop:UserWarning")


@pytest.mark.parametrize("dtype", [torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64])
def test_next_token_labels_are_int64_whatever_the_ids_dtype(dtype):
    ids = SEQS[:2, :6].to(dtype)
    mask = torch.ones_like(ids)
    mask[1, 4:] = 0
    y = next_token_labels(ids, mask)
    assert y.dtype == torch.int64 and (y < len(CHARS)).all()
    assert y[0, :-1].tolist() == ids[0, 1:].long().tolist() and y[0, -1] == -100  # −100, not 156 for uint8
    assert y[1].tolist() == [*ids[1, 1:4].long().tolist(), -100, -100, -100]
    with pytest.raises(TypeError, match=r"must be token ids \(an integer tensor\), got torch.float32"):
        next_token_labels(ids.float())
