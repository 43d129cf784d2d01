"""`WeightAveraging` / `EMAWeightAveraging`: the average equals a hand-computed EMA, is swapped in for validation and
kept after training, goes into checkpoints (``averaged_model.bin``), and a resumed run continues it bit for bit."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from callbacks.base import Callback
from callbacks.weight_averaging import AVERAGED_MODEL_FILE, EMAWeightAveraging, WeightAveraging
from tests.unit.test_checkpoint_resume import TOTAL_STEPS, assert_same_weights, run_fit

DECAY = 0.75


class StepWeights(Callback):
    """Records the module's weights after each optimizer step, and what validation sees."""

    def __init__(self) -> None:
        self.after_step: list[dict[str, torch.Tensor]] = []
        self.in_validation: list[tuple[int, dict[str, torch.Tensor]]] = []
        self._seen = 0

    def on_train_batch_end(self, trainer: Any, module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if trainer.global_step > self._seen:
            self._seen = trainer.global_step
            self.after_step.append({k: v.detach().clone() for k, v in module.state_dict().items()})

    def on_validation_epoch_start(self, trainer: Any, module: Any) -> None:  # runs after the averaging callback's
        if not trainer.sanity_checking:
            self.in_validation.append((trainer.global_step, {k: v.detach().clone() for k, v in module.state_dict().items()}))


def hand_ema(steps: list[dict[str, torch.Tensor]], decay: float) -> list[dict[str, torch.Tensor]]:
    """torch's EMA, step by step: the first update copies, then ``decay * average + (1 - decay) * weights``."""
    out: list[dict[str, torch.Tensor]] = []
    for weights in steps:
        out.append(dict(weights) if not out else {k: decay * out[-1][k] + (1 - decay) * w for k, w in weights.items()})
    return out


def assert_equal(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    assert [k for k in a if not torch.equal(a[k], b[k])] == []


@pytest.mark.timeout(300)
def test_ema_equals_a_hand_computed_ema_and_is_used_for_validation_and_at_the_end(tmp_path: Path) -> None:
    ema, record = EMAWeightAveraging(decay=DECAY), StepWeights()
    module, _, _ = run_fit(tmp_path, 7, extra_callbacks=(ema, record), validate_every=3)
    assert len(record.after_step) == 7
    expected = hand_ema(record.after_step, DECAY)
    assert ema.average_model is not None and int(ema.average_model.n_averaged) == 7
    assert_equal(dict(ema.average_model.module.state_dict()), expected[-1])
    assert_equal(dict(module.state_dict()), expected[-1])  # copied into the module when training ends
    assert record.in_validation, "no validation ran"
    for step, seen in record.in_validation:  # validation sees the average of the steps taken so far
        assert_equal(seen, expected[step - 1])


@pytest.mark.timeout(300)
def test_averaging_leaves_training_unchanged(tmp_path: Path) -> None:
    # the swap for validation is undone: the trained weights (so every loss) are those of a run without the callback
    plain, _, plain_log = run_fit(tmp_path / "plain", 7, validate_every=3)
    averaged, _, averaged_log = run_fit(tmp_path / "ema", 7, extra_callbacks=(EMAWeightAveraging(decay=DECAY),), validate_every=3)
    assert plain.losses == averaged.losses
    assert plain_log.validation != averaged_log.validation  # validation ran on the averaged weights


class EveryOtherStep(WeightAveraging):
    def should_update(self, step_idx: int | None = None, epoch_idx: int | None = None) -> bool:
        return step_idx is not None and step_idx % 2 == 1


def test_should_update_picks_the_steps_and_the_default_average_is_the_mean(tmp_path: Path) -> None:
    swa, record = EveryOtherStep(), StepWeights()
    run_fit(tmp_path, 6, extra_callbacks=(swa, record))
    picked = record.after_step[1::2]  # after steps 1, 3, 5 (0-based)
    assert swa.average_model is not None and int(swa.average_model.n_averaged) == 3
    got = dict(swa.average_model.module.state_dict())
    for key, value in got.items():
        mean = picked[0][key]
        for n, weights in enumerate(picked[1:], start=1):  # torch's running mean, in its order of operations
            mean = mean + (weights[key] - mean) / (n + 1)
        assert torch.equal(value, mean), key


@pytest.mark.timeout(300)
@pytest.mark.parametrize("stop_step", [3, 8], ids=["epoch0-mid", "after-validation"])
def test_resume_continues_the_same_average_bit_exactly(tmp_path: Path, stop_step: int) -> None:
    straight_ema = EMAWeightAveraging(decay=DECAY)
    straight, _, straight_log = run_fit(tmp_path / "straight", TOTAL_STEPS, extra_callbacks=(straight_ema,), validate_every=3)
    first_ema = EMAWeightAveraging(decay=DECAY)
    first, _, _ = run_fit(tmp_path, stop_step, every_n_train_steps=stop_step, extra_callbacks=(first_ema,), validate_every=3)
    ckpt = next((tmp_path / "ckpts").iterdir())
    assert (ckpt / AVERAGED_MODEL_FILE).is_file() and (ckpt / "model.safetensors").is_file()
    resumed_ema = EMAWeightAveraging(decay=DECAY)
    resumed, trainer, resumed_log = run_fit(tmp_path, TOTAL_STEPS, ckpt_path="last", every_n_train_steps=stop_step, init_seed=99,
                                            extra_callbacks=(resumed_ema,), validate_every=3)
    assert trainer.global_step == TOTAL_STEPS
    assert {**first.losses, **resumed.losses} == straight.losses
    assert_same_weights(straight, resumed)  # the averages, copied in at the end
    assert straight_ema.average_model is not None and resumed_ema.average_model is not None
    assert_equal(dict(straight_ema.average_model.state_dict()), dict(resumed_ema.average_model.state_dict()))
    assert int(resumed_ema.average_model.n_averaged) == TOTAL_STEPS
    assert resumed_log.validation == {s: v for s, v in straight_log.validation.items() if s >= min(resumed_log.validation)}
    assert not any(part.file == AVERAGED_MODEL_FILE for part in trainer.accelerator.checkpoint_parts)  # removed at teardown


def test_a_checkpoint_without_an_average_starts_it_from_the_restored_weights(tmp_path: Path) -> None:
    run_fit(tmp_path, 3, every_n_train_steps=3)
    ema, record = EMAWeightAveraging(decay=DECAY), StepWeights()
    run_fit(tmp_path, 5, ckpt_path="last", every_n_train_steps=3, extra_callbacks=(ema, record), init_seed=99)
    # as Lightning: the first batch of the resumed run adds the restored weights (step 3), then steps 4 and 5
    assert len(record.after_step) == 3 and ema.average_model is not None and int(ema.average_model.n_averaged) == 3
    assert_equal(dict(ema.average_model.module.state_dict()), hand_ema(record.after_step, DECAY)[-1])


def test_ema_should_update_follows_lightning() -> None:
    ema = EMAWeightAveraging(update_every_n_steps=2, update_starting_at_step=4, update_starting_at_epoch=1)
    assert [s for s in range(10) if ema.should_update(step_idx=s)] == [4, 6, 8]
    assert [e for e in range(3) if ema.should_update(epoch_idx=e)] == [1, 2]
    assert not EMAWeightAveraging().should_update(epoch_idx=5)
    with pytest.raises(ValueError, match="decay"):
        EMAWeightAveraging(decay=1.5)


def test_sharded_strategies_are_refused_with_the_reason() -> None:
    class Sharded:
        sharded = True

    class View:
        strategy = Sharded()

    with pytest.raises(NotImplementedError, match="shards or owns the parameters"):
        EMAWeightAveraging().setup(View(), None, "fit")  # type: ignore[arg-type]
