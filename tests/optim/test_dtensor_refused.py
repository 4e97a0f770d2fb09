"""FSDP2's sharded parameters where they cannot be trained are refused (issue 31, item 17; issue 34).

Under ``fully_shard`` every parameter is a DTensor. The element-wise rules train shards (θ written into
them in place, ``ngvi.optim.engine.sharded``; ``tests/test_fsdp2.py``) with noise keyed by each weight's
place (``noise="chunked"``), and refuse other noise, which would depend on the number of ranks; the rules
whose sample or curvature spans whole layers refuse DTensor parameters, naming DDP. Both at construction
and in ``add_param_group``. One gloo process group of one rank on CPU (a file store) is enough to build them.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import ngvi
from ngvi import _validation as check
from ngvi.optim.engine import flat
from optimizer_db import trainers

dist = pytest.importorskip("torch.distributed")
if not dist.is_available() or not dist.is_gloo_available():
    pytest.skip("torch.distributed with gloo is not available in this torch build", allow_module_level=True)

ENGINE = trainers(lambda i: i.engine)
CLASSES = [p for i, p in enumerate(ENGINE) if p.values[0].cls not in {q.values[0].cls for q in ENGINE[:i]}]
REFUSED = (
    r"parameter .* is a DTensor \(sharded by FSDP2's fully_shard.*across whole layers.*"
    r"torch\.nn\.parallel\.DistributedDataParallel \(DDP\)"
)
NEEDS_CHUNKED = r"FSDP2-sharded parameters need noise='chunked'"


@pytest.fixture(scope="module")
def mesh(tmp_path_factory):
    if dist.is_initialized():
        pytest.skip("a process group is already initialised in this process")
    store = tmp_path_factory.mktemp("gloo") / "store"
    dist.init_process_group("gloo", init_method=f"file://{store}", rank=0, world_size=1)
    try:
        from torch.distributed.device_mesh import init_device_mesh

        yield init_device_mesh("cpu", (1,))
    finally:
        dist.destroy_process_group()


def _sharded(model: nn.Module, mesh) -> nn.Module:
    from torch.distributed.fsdp import fully_shard

    fully_shard(model, mesh=mesh)
    assert all(type(p).__name__ == "DTensor" for p in model.parameters())
    return model


def test_every_class_is_covered():
    assert len(CLASSES) == 13  # every class built on the engine (MAP and MC dropout are torch Adam)


@pytest.mark.parametrize("info", CLASSES)
def test_a_fully_sharded_model_is_refused_naming_ddp_or_the_noise(info, mesh):
    """The element-wise rules train shards with the noise they choose there ("chunked", issue 42 item 7)
    and refuse other noise given explicitly; the others refuse shards, naming DDP."""
    model = _sharded(info.model(), mesh)
    elementwise = flat.takes_shards(info.build(info.model()))
    with pytest.raises(ValueError, match=NEEDS_CHUNKED if elementwise else REFUSED):
        info.build(model, **({"noise": "normal"} if elementwise else {}))
    if elementwise:  # with the noise left unset it trains (tests/test_fsdp2.py checks what it computes)
        opt = info.build(model)
        assert opt.noise == "chunked"
        info.train(model, opt, 2)


def test_a_dtensor_group_is_refused_and_the_optimizer_is_left_as_it_was(mesh):
    from torch.distributed.tensor import Replicate, distribute_tensor

    model = nn.Linear(3, 1).double()
    opt = ngvi.IVON(model.parameters(), 10)
    extra = nn.Parameter(distribute_tensor(torch.zeros(2, dtype=torch.float64), mesh, [Replicate()]))
    with pytest.raises(ValueError, match=r"sharded by rows on a 1-D mesh.*got placements \(Replicate"):
        opt.add_param_group({"params": [extra]})
    assert len(opt.param_groups) == 1


def test_plain_tensors_pass():
    check.no_dtensor("IVON", [torch.zeros(2, requires_grad=True)], 0, None)
