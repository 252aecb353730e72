"""The frozen, strict base of every config section and field types shared by sections."""

from __future__ import annotations

import types
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator


def _admits_bool(annotation: Any) -> bool:
    """Whether a field's type takes a bool (bool, Any, or a union or alias holding one)."""
    if annotation is bool or annotation is Any:
        return True
    if get_origin(annotation) in (Annotated, Union, types.UnionType):
        return any(_admits_bool(arg) for arg in get_args(annotation))
    return False


class _Section(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    @field_validator("*", mode="before")
    @classmethod
    def _no_bool_for_a_number(cls, value: Any, info: ValidationInfo) -> Any:
        # pydantic's lax mode reads `max_steps: true` as 1: a typo that would run silently
        field = cls.model_fields.get(info.field_name or "")
        if isinstance(value, bool) and field is not None and not _admits_bool(field.annotation):
            raise ValueError(f"expected {_type_name(field.annotation)}, not {str(value).lower()}")
        return value


def _type_name(annotation: Any) -> str:
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def fields_of(section: Any, *names: str) -> dict[str, Any]:
    """``names`` -> their values in ``section``: settings handed on under the same names."""
    return {name: getattr(section, name) for name in names}


# Training fields repeated verbatim (type, bounds, description) in ExperienceConfig,
# AgentConfig and the policy's SFT/DPO sections: one definition each, the default stays at
# the use site. Annotated aliases, not a shared base class: a base class would move these
# fields first and reorder model_dump, the logged params and the JSON schema.
LearningRate = Annotated[float, Field(gt=0)]
OptimizerSteps = Annotated[int, Field(ge=-1, description="optimizer steps (-1 = use epochs)")]
TrainMinutes = Annotated[
    float | None,
    Field(gt=0, description="stop training (and save) after this wall-clock budget"),
]
GradAccum = Annotated[int, Field(ge=1, description="gradient accumulation steps")]
WarmupRatio = Annotated[float, Field(ge=0, lt=1)]
WeightDecay = Annotated[float, Field(ge=0)]
LoggingSteps = Annotated[int, Field(ge=1)]
SaveSteps = Annotated[int, Field(ge=1, description="checkpoint interval (resume after a kill)")]
EvalLossExamples = Annotated[
    int, Field(ge=0, description="validation examples for the teacher-forced eval loss")
]
Bf16 = Annotated[
    bool | None, Field(description="bf16 autocast (None = on a CUDA GPU that supports it)")
]
UseLoRA = Annotated[bool, Field(description="train LoRA adapters (merged before saving)")]
LoRARank = Annotated[int, Field(ge=1)]
LoRAAlpha = Annotated[int, Field(ge=1)]
# numpy's generators refuse a negative seed, deep inside a stage: refuse it in the config
Seed = Annotated[int, Field(ge=0)]
