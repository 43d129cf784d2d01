import pytest
import torch

from strategies.precision import Precision, normalize_precision


@pytest.mark.parametrize("value,expected", [(None, "no"), ("32", "no"), ("no", "no"), ("16-mixed", "fp16"), ("fp16", "fp16"),
                                            ("bf16-mixed", "bf16"), ("bf16", "bf16")])
def test_aliases(value, expected):
    assert normalize_precision(value) == expected


def test_bad_precision_message():
    with pytest.raises(ValueError, match="mixed_precision='fp61' is not supported; choose one of 'no', 'fp16', 'bf16'"):
        normalize_precision("fp61")


def test_bf16_autocast_runs_matmul_in_bf16():
    p = Precision("bf16", torch.device("cpu"))
    with p.autocast():
        out = torch.ones(2, 2) @ torch.ones(2, 2)
    assert out.dtype == torch.bfloat16


def test_fp16_skips_step_on_inf_and_halves_scale():
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    p = Precision("fp16", torch.device("cpu"))
    before = [t.clone() for t in model.parameters()]
    loss = model(torch.ones(1, 2)).sum() * float("inf")
    p.backward(loss)
    scale = p.scaler.get_scale()
    assert p.optimizer_step(opt) is False and p.step_was_skipped
    assert p.scaler.get_scale() < scale
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    opt.zero_grad()
    p.backward(model(torch.ones(1, 2)).sum())
    assert p.optimizer_step(opt) is True
    assert not all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
