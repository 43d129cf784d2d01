"""``lightning.pytorch.utilities.deepspeed`` under the rename: nothing to convert."""

from __future__ import annotations

from trainer.lightning_api import not_offered

convert_zero_checkpoint_to_fp32_state_dict = not_offered(
    "convert_zero_checkpoint_to_fp32_state_dict", "lightning.pytorch.utilities.deepspeed",
    "a DeepSpeed checkpoint here already holds the full float32 weights (model.safetensors): load it with "
    "Model.load_from_checkpoint(path)",
    module=__name__,
)

__all__ = ["convert_zero_checkpoint_to_fp32_state_dict"]
