"""The live classes' request and response models (app/api/routes/classes.py): their limits, stated in the
schema, are the ones the service holds a class to (app/service/classes.py)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field

from app.service.classes import MAX_OPTION_CHARS, MAX_OPTIONS, MAX_PATH_CHARS, MAX_QUESTION_CHARS


class StartRequest(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"path": "/lessons/attention"}]})

    path: str = Field("/", min_length=1, max_length=MAX_PATH_CHARS, description="the page the class opens on")


class StateRequest(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"path": "/?text=Ali+makan+nasi&layer=1"}]})

    path: str = Field(
        min_length=1,
        max_length=MAX_PATH_CHARS,
        description="a page of this site with its state, e.g. /?text=Ali+makan&layer=1 (not another site, not the API)",
    )


class PollRequest(BaseModel):
    model_config = ConfigDict(
        json_schema_extra={"examples": [{"question": "Which token comes next?", "options": ["nasi", "roti"]}]}
    )

    question: str = Field(min_length=1, max_length=MAX_QUESTION_CHARS, description="shown as text, never as HTML")
    options: list[Annotated[str, Field(min_length=1, max_length=MAX_OPTION_CHARS)]] = Field(
        min_length=2, max_length=MAX_OPTIONS, description="the buttons students choose from, each different"
    )
    kind: Literal["free", "next_token", "induction_head"] = Field(
        "free",
        description="free: the teacher reveals their own pick; next_token: the server reveals the top next token "
        "(and its probability) of the model and text of the class's current page; induction_head: the head "
        "L{layer}H{head} of that model with the highest induction score",
    )


class AnswerRequest(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"option": "nasi"}]})

    option: str = Field(min_length=1, max_length=MAX_OPTION_CHARS, description="one of the poll's options, as written")


class RevealRequest(BaseModel):
    model_config = ConfigDict(json_schema_extra={"examples": [{"answer": "nasi"}]})

    answer: str | None = Field(
        None,
        max_length=MAX_OPTION_CHARS,
        description="the teacher's answer to a free-text poll, shown to everyone (the server works out the "
        "answer of a next_token or induction_head poll)",
    )


class Started(BaseModel):
    code: str
    join_url: str = Field(description="the students' page: /class/{code}")
    teacher_token: str = Field(
        description="the teacher's secret: send it as `Authorization: Bearer` (keep it out of URLs)"
    )
    path: str


class ClassState(BaseModel):
    code: str
    path: str = Field(description="the teacher's current page")
    students: int
    poll: dict | None = Field(None, description="the open poll: {id, question, options}")


class PollResult(BaseModel):
    id: int
    question: str
    options: list[str]
    counts: list[int] = Field(description="answers per option, in the options' order")
    closed: bool
    answer: str | None = None
    kind: str = Field("free", description="free, next_token or induction_head")
    detail: dict | None = Field(
        None,
        description="the model's answer as the server computed it: {kind, model, text, token, prob} or "
        "{kind, model, head, score}",
    )


class Pushed(BaseModel):
    id: str = Field(description="the `state` event's id")
    path: str
