"""A keyless local server's placeholder key is no secret: teacher text keeps the word."""

from __future__ import annotations

import pytest

from components.lm.retry import EMPTY_KEY, Redactor
from components.teacher import iter_requests
from components.teacher.openai_teacher import OpenAITeacher
from tests.teacher.conftest import KEY_ENV, make_trajectories, openai_teacher_config

pytestmark = pytest.mark.timeout(60)
TEXT = "The fridge is EMPTY, so the action changes nothing."


def test_the_keyless_placeholder_is_not_redacted(monkeypatch, api_key) -> None:
    assert Redactor(EMPTY_KEY)(TEXT) == TEXT
    teacher = OpenAITeacher(openai_teacher_config("http://127.0.0.1:9/v1"))
    assert teacher._redact(f"{TEXT} {api_key}") == f"{TEXT} ***"  # a real key still goes
    teacher.close()
    monkeypatch.delenv(KEY_ENV)
    keyless = OpenAITeacher(openai_teacher_config("http://127.0.0.1:9/v1"))
    assert keyless._redact(f"{TEXT} Bearer {EMPTY_KEY}") == f"{TEXT} Bearer ***"
    keyless.close()


def test_keyless_teacher_reasoning_keeps_the_word(monkeypatch, fake_openai) -> None:
    monkeypatch.delenv(KEY_ENV, raising=False)
    srv = fake_openai(answer_fn=lambda body: f"<think>{TEXT}</think>")
    teacher = OpenAITeacher(openai_teacher_config(srv.base_url, concurrency=1))
    [ann] = teacher.annotate(list(iter_requests(make_trajectories(1, 1), history_len=2)))
    teacher.close()
    assert ann.ok and ann.reasoning == TEXT
    assert srv.completion_requests[0].headers["authorization"] == f"Bearer {EMPTY_KEY}"
