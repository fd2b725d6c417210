"""Just enough of Docker's file formats to test ours without an engine: a Dockerfile's stages and
instructions, and which paths .dockerignore keeps out of the build context."""

from __future__ import annotations

import fnmatch
import json
import shlex
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class Instruction:
    keyword: str  # upper case: FROM, RUN, COPY ...
    args: str  # the rest of the logical line, continuations joined

    def words(self) -> list[str]:
        """The arguments as a list, from either the exec form (JSON array) or the shell form."""
        if self.args.startswith("["):
            return json.loads(self.args)
        return shlex.split(self.args)

    def flags(self) -> dict[str, str]:
        """Leading --name=value options (COPY --from=..., HEALTHCHECK --interval=...)."""
        found = {}
        for word in self.args.split():
            if not word.startswith("--"):
                break
            name, _, value = word[2:].partition("=")
            found[name] = value
        return found


@dataclass
class Stage:
    base: str  # image reference, e.g. python:3.11-slim-bookworm, or an earlier stage's name
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None


def parse_dockerfile(text: str) -> list[Stage]:
    stages: list[Stage] = []
    logical = ""
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("#") or (not line and logical):
            continue  # comments (and blank lines) may sit inside a continued instruction
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical = (logical + line).strip()
        if logical:
            keyword, _, args = logical.partition(" ")
            instruction = Instruction(keyword.upper(), args.strip())
            if instruction.keyword == "FROM":
                words = [w for w in args.split() if not w.startswith("--")]
                name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
                stages.append(Stage(base=words[0], name=name))
            elif not stages:
                raise ValueError(f"{instruction.keyword} before the first FROM")
            else:
                stages[-1].instructions.append(instruction)
        logical = ""
    return stages


def healthcheck_command(stage: Stage) -> list[str]:
    """The words after HEALTHCHECK's options and its CMD keyword."""
    check = stage.last("HEALTHCHECK")
    if check is None:
        raise ValueError("no HEALTHCHECK in this stage")
    _options, _, command = check.args.partition(" CMD ")
    return shlex.split(command)


def ignore_patterns(text: str) -> list[str]:
    return [p.strip().strip("/") for p in text.splitlines() if p.strip() and not p.strip().startswith("#")]


def is_ignored(rel_path: str, patterns: list[str]) -> bool:
    """Does .dockerignore keep `rel_path` (or a folder above it) out of the context? No `!` rules."""
    parts = Path(rel_path).parts
    prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    for pattern in patterns:
        if pattern.startswith("!"):
            raise ValueError(f"exception rules like {pattern!r} are not understood here")
        candidates = [pattern, pattern[3:]] if pattern.startswith("**/") else [pattern]
        for p in prefixes:
            if any(fnmatch.fnmatchcase(p, c) for c in candidates):
                return True
    return False
