"""`TaskSpec`: which problems a task holds (operation and style, or a task file; operands, shots, sample) and
how its answers are scored."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import BaseModel, Field, PrivateAttr, field_validator, model_validator

from af1.tasks.builtin import FILE_STYLE, OPERATIONS, STYLES
from af1.tasks.files import file_digest, read_task_file

Scoring = Literal["full", "first"]
DEFAULT_N = 1_000  # without --n, a task of more distinct problems is sampled to this size (the paper's)


class TaskSpec(BaseModel):
    """Which problems to build and how to score them: operation, style, operands, few-shot prefix, sample. A field
    with a description is a command-line option of every task experiment (`af1.cli` derives it, flag and help)."""

    operation: str = Field(
        default="a+b", description=f"{', '.join(OPERATIONS)}", json_schema_extra={"flag": "--task", "short": "-t"}
    )
    style: str = Field(default="original", description=", ".join(STYLES))
    digits: int = Field(default=1, ge=1, le=3, description="digits per operand")
    shots: int = Field(default=0, ge=0, description="worked examples in the constant prefix")
    n: int | None = Field(default=None, ge=1, description="problems to sample (default: all, at most a seeded 1000)")
    n_max: int | None = Field(default=None, ge=1)  # like n, but takes all problems when there are fewer
    seed: int = Field(default=0, description="sampling seed")
    allow_negative: bool = Field(default=False, description="keep problems with negative results")
    answer_digits: Literal["auto", "constant", "any"] = Field(
        default="auto",
        description="auto (any with full scoring, constant with first), constant (the most common digit count) or any",
    )
    scoring: Scoring = Field(
        default="full", description="full: every answer token (teacher forced); first: the first token only"
    )
    check_end: bool = Field(
        default=True,
        description="full scoring also checks that the model stops after the answer, where the worked examples show "
        "what follows it (their separator)",
    )
    largest_layout: bool = Field(default=False, description="keep the largest group of same-layout prompts")
    file: str | None = Field(
        default=None,
        description="a task file (YAML or TOML: rows or a template), or a .jsonl/.csv of prompt and answer rows; "
        "replaces --task and --style",
        json_schema_extra={"flag": "--task-file"},
    )
    file_sha256: str | None = None  # of the file and what it reads, filled in: a changed file is another task
    _file_name: str | None = PrivateAttr(default=None)  # the task file's name, read with it

    @model_validator(mode="after")
    def _read_file(self) -> TaskSpec:
        if self.file is not None:
            object.__setattr__(self, "file", str(Path(self.file).resolve()))  # any worker finds it, whatever its cwd
            task = read_task_file(self.file)
            digest = file_digest(self.file, task)
            if self.file_sha256 is not None and self.file_sha256 != digest:
                raise ValueError(f"task file {self.file} changed since this task was described (sha256 differs)")
            object.__setattr__(self, "file_sha256", digest)
            for key in ("shots", "scoring", "check_end"):  # the file's, unless given here (given wins)
                if getattr(task, key) is not None and key not in self.model_fields_set:
                    object.__setattr__(self, key, getattr(task, key))
            self._file_name = task.name or Path(self.file).stem
        return self

    @property
    def name(self) -> str:
        """What the task is called in tables: the operation, or the task file's name (its stem by default)."""
        return self.operation if self._file_name is None else self._file_name

    def described(self) -> dict[str, object]:
        """The task as provenance gives it: every field, less those a task file replaces (operation, style, digits,
        negatives), and its name."""
        data = self.model_dump()
        if self.file is not None:
            for key in ("operation", "style", "digits", "allow_negative"):
                del data[key]
        return {"name": self.name, **data}

    @property
    def style_name(self) -> str:
        """The input style in results and tables: a task file has none of the built-in ones (its template says)."""
        return self.style if self.file is None else FILE_STYLE

    @field_validator("operation")
    @classmethod
    def _known_operation(cls, value: str) -> str:
        if value not in OPERATIONS:
            raise ValueError(f"unknown task '{value}'; choose one of {', '.join(OPERATIONS)}")
        return value

    @field_validator("style")
    @classmethod
    def _known_style(cls, value: str) -> str:
        if value not in STYLES:
            raise ValueError(f"unknown style '{value}'; choose one of {', '.join(STYLES)}")
        return value

    @property
    def operand_range(self) -> range:
        if self.operation == "a*b" or self.digits == 1:
            return range(0, 10) if self.operation != "a*b" else range(1, 10)
        return range(10 ** (self.digits - 1), 10**self.digits)

    @property
    def constant_answer_digits(self) -> bool:
        """Keep one answer digit count: only for first-token scoring, where the first digit must mean one thing."""
        return self.answer_digits == "constant" or (self.answer_digits == "auto" and self.scoring == "first")
