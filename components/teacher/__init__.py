"""Teacher annotation: a reasoning trace for every real transition (grounded, openai, hf)."""

from components.teacher.annotate import (
    AnnotationFileError,
    annotate,
    failures_path_for,
    iter_annotations,
    load_annotations,
    make_teacher,
    teacher_identity,
)
from components.teacher.base import (
    Annotation,
    AnnotationRequest,
    BudgetExhaustedError,
    MalformedAnswerError,
    Teacher,
    TeacherError,
    iter_requests,
    parse_reasoning,
)
from components.teacher.grounded import GroundedTeacher, grounded_reasoning

__all__ = [
    "Annotation",
    "AnnotationFileError",
    "AnnotationRequest",
    "BudgetExhaustedError",
    "GroundedTeacher",
    "MalformedAnswerError",
    "Teacher",
    "TeacherError",
    "annotate",
    "failures_path_for",
    "grounded_reasoning",
    "iter_annotations",
    "iter_requests",
    "load_annotations",
    "make_teacher",
    "parse_reasoning",
    "teacher_identity",
]
