"""A small Dockerfile reader, enough to check the structure of the project's own Dockerfile.

No Docker engine (and no hadolint) exists here, so the image cannot be built or linted by the
real tools; what can be checked is the file's shape: which stages exist, what each is built
from once build ARGs are substituted, who the final stage runs as, what it installs. The
reader follows the Dockerfile grammar that matters for that: parser directives, comments,
backslash continuations, JSON (exec) form vs. shell form, ``ARG`` defaults before ``FROM``.

It also evaluates ``.dockerignore`` patterns the way the Docker CLI does (the last matching
pattern wins; a pattern that matches a parent directory matches everything under it), so a
test can tell which files would reach the build context.
"""

from __future__ import annotations

import dataclasses
import json
import re
import shlex
from pathlib import Path


@dataclasses.dataclass(frozen=True)
class Instruction:
    """One instruction: its keyword (upper case), raw argument text and source line."""

    keyword: str
    text: str
    line: int

    @property
    def exec_form(self) -> list[str] | None:
        """The JSON array of an exec-form instruction (``["a", "b"]``), else ``None``."""
        stripped = self.text.strip()
        if not stripped.startswith("["):
            return None
        try:
            parsed = json.loads(stripped)
        except json.JSONDecodeError:
            return None
        if isinstance(parsed, list) and all(isinstance(item, str) for item in parsed):
            return parsed
        return None

    @property
    def flags(self) -> dict[str, str]:
        """Leading ``--name=value`` options (``COPY --from=x``, ``RUN --mount=...``)."""
        found: dict[str, str] = {}
        for word in shlex.split(self.text):
            if not word.startswith("--"):
                break
            name, _, value = word[2:].partition("=")
            found[name] = value
        return found


@dataclasses.dataclass
class Stage:
    """A build stage: the image it starts from (ARGs substituted), its name, its instructions."""

    base: str
    name: str | None
    instructions: list[Instruction]

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]

    def last(self, keyword: str) -> Instruction | None:
        found = self.all(keyword)
        return found[-1] if found else None

    @property
    def run_text(self) -> str:
        """Every RUN of the stage, joined: what it executes, for substring checks."""
        return "\n".join(i.text for i in self.all("RUN"))


@dataclasses.dataclass
class Dockerfile:
    directives: dict[str, str]
    global_args: dict[str, str]
    stages: list[Stage]

    @property
    def final(self) -> Stage:
        return self.stages[-1]


_DIRECTIVE = re.compile(r"^#\s*([a-zA-Z]+)\s*=\s*(.+?)\s*$")
_ARG_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}|\$([A-Za-z_][A-Za-z0-9_]*)")


def logical_lines(text: str) -> tuple[dict[str, str], list[tuple[int, str]]]:
    """Parser directives, and the instruction lines with continuations joined."""
    directives: dict[str, str] = {}
    lines = text.splitlines()
    index = 0
    # NB: directives only count before the first comment, blank line or instruction.
    while index < len(lines) and (match := _DIRECTIVE.match(lines[index])):
        directives[match.group(1).lower()] = match.group(2)
        index += 1
    joined: list[tuple[int, str]] = []
    pending: list[str] = []
    start = 0
    for number, raw in enumerate(lines[index:], start=index + 1):
        stripped = raw.strip()
        if stripped.startswith("#"):
            continue  # comments may sit between continuation lines, too
        if not pending:
            if not stripped:
                continue
            start = number
        if stripped.endswith("\\"):
            pending.append(stripped[:-1].strip())
            continue
        pending.append(stripped)
        joined.append((start, " ".join(part for part in pending if part)))
        pending = []
    if pending:
        raise ValueError(f"line {start}: continuation runs past the end of the file")
    return directives, joined


def substitute(text: str, args: dict[str, str]) -> str:
    """``$NAME`` and ``${NAME}`` replaced by ARG values (unknown names become empty)."""
    return _ARG_REFERENCE.sub(lambda m: args.get(m.group(1) or m.group(2), ""), text)


def parse(text: str) -> Dockerfile:
    directives, lines = logical_lines(text)
    global_args: dict[str, str] = {}
    stages: list[Stage] = []
    for number, line in lines:
        keyword, _, rest = line.partition(" ")
        instruction = Instruction(keyword=keyword.upper(), text=rest.strip(), line=number)
        if instruction.keyword == "FROM":
            words = [w for w in instruction.text.split() if not w.startswith("--")]
            base = substitute(words[0], global_args)
            name = words[2] if len(words) >= 3 and words[1].upper() == "AS" else None
            stages.append(Stage(base=base, name=name, instructions=[]))
        elif not stages:
            if instruction.keyword != "ARG":
                raise ValueError(f"line {number}: only ARG may come before the first FROM")
            arg_name, _, default = instruction.text.partition("=")
            global_args[arg_name.strip()] = default.strip().strip('"')
        else:
            stages[-1].instructions.append(instruction)
    return Dockerfile(directives=directives, global_args=global_args, stages=stages)


def read(path: Path) -> Dockerfile:
    return parse(path.read_text())


def _pattern_regex(pattern: str) -> re.Pattern[str]:
    """A .dockerignore pattern as a regex: Go filepath.Match plus ``**`` (any directories)."""
    out = []
    index = 0
    while index < len(pattern):
        char = pattern[index]
        if pattern.startswith("**", index):
            index += 2
            if pattern.startswith("/", index):
                index += 1
                out.append("(?:.*/)?")
            else:
                out.append(".*")
            continue
        if char == "*":
            out.append("[^/]*")
        elif char == "?":
            out.append("[^/]")
        elif char == "[":
            end = pattern.index("]", index)
            out.append(pattern[index : end + 1].replace("[!", "[^"))
            index = end
        else:
            out.append(re.escape(char))
        index += 1
    return re.compile("".join(out) + r"\Z")


def dockerignore_patterns(text: str) -> list[tuple[bool, re.Pattern[str]]]:
    """(is exception, regex) per pattern line, in order."""
    patterns: list[tuple[bool, re.Pattern[str]]] = []
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        exception = line.startswith("!")
        line = line[1:].strip() if exception else line
        cleaned = "/".join(part for part in line.strip("/").split("/") if part not in ("", "."))
        patterns.append((exception, _pattern_regex(cleaned)))
    return patterns


def is_ignored(relative_path: str, patterns: list[tuple[bool, re.Pattern[str]]]) -> bool:
    """Whether the Docker CLI leaves this path (relative to the context) out of the context."""
    parts = relative_path.strip("/").split("/")
    candidates = ["/".join(parts[: n + 1]) for n in range(len(parts))]
    ignored = False
    for exception, regex in patterns:
        if any(regex.match(candidate) for candidate in candidates):
            ignored = not exception
    return ignored
