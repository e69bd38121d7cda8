"""Loading WORKFLOW.md into typed settings and a parsed prompt template, in one pipeline.

The pipeline (each step's failure has its own code): select the path → read the file → split the
front matter from the body → decode the YAML → set aside ``flags:``/``features:`` and unknown
top-level keys → refuse flag-only sections written as sections → resolve flags and features
from the CLI, the front matter and the environment → drop nulls, resolve ``$VAR`` and paths →
validate everything with the one settings model → parse the prompt template.

The middle of it, from a decoded mapping to settings, is :func:`settings_from_mapping`, which
touches no file: the Kubernetes operator validates a ``Workflow`` spec with it.

Validation is strict: an invalid value is an error naming its key path, never a silent fallback
to the default. The only leniency is for unknown *top-level* keys, which other tools may own;
they are ignored with a warning.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any

import pydantic

from lorenz.codes import ErrorCode
from lorenz.config import (
    CODED_CONFIG_ERRORS,
    FLAG_ONLY_SECTIONS,
    TOP_LEVEL_SECTIONS,
    WorkflowSettings,
)
from lorenz.model import Issue, RetryKind
from lorenz.workflow.bounded_yaml import MAX_WORKFLOW_BYTES, MAX_YAML_DEPTH
from lorenz.workflow.documents import decode_workflow_bytes, parse_front_matter, split_front_matter
from lorenz.workflow.errors import (
    ConfigProblem,
    FlagOnlySection,
    InvalidWorkflowConfig,
    MissingWorkflowFile,
    WorkflowTooComplex,
    WorkflowTooLarge,
)
from lorenz.workflow.flags import (
    FEATURES,
    KNOWN_FLAGS,
    FlagResolution,
    FlagSource,
    FlagValue,
    resolve_flags,
)
from lorenz.workflow.preflight import SUPPORTED_TRACKER_KINDS
from lorenz.workflow.prompts import PromptTemplate
from lorenz.workflow.resolving import resolve_front_matter
from lorenz.workflow.schema import model_at

logger = logging.getLogger("lorenz.workflow")

DEFAULT_WORKFLOW_FILENAME = "WORKFLOW.md"
FLAGS_KEY = "flags"
FEATURES_KEY = "features"

_NO_FLAGS: Mapping[str, str] = MappingProxyType({})


@dataclasses.dataclass(frozen=True, slots=True)
class WorkflowStamp:
    """What a workflow file looked like when read: any difference means "reload"."""

    mtime_ns: int
    size: int
    sha256: str


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class ResolvedSettings:
    """The result of :func:`settings_from_mapping`."""

    settings: WorkflowSettings
    warnings: tuple[str, ...]
    """Things ignored but worth telling the user (unknown top-level keys)."""
    flag_sources: Mapping[str, FlagValue]
    """Every known flag → its effective (typed) value and source."""
    feature_sources: Mapping[str, FlagValue]
    """Every known feature → on/off and source."""


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class LoadedWorkflow:
    """A fully loaded WORKFLOW.md: settings, prompt, and what is needed to notice changes."""

    path: Path
    """Absolute path of the file (symlinks kept; see :attr:`canonical_path`)."""
    settings: WorkflowSettings
    prompt_template: str
    """The body, trimmed ("" means the default prompt is used)."""
    prompt: PromptTemplate
    """The body parsed once, rendered per run."""
    raw: Mapping[str, Any]
    """The front matter exactly as decoded from YAML."""
    warnings: tuple[str, ...]
    flag_sources: Mapping[str, FlagValue]
    feature_sources: Mapping[str, FlagValue]
    stamp: WorkflowStamp

    @property
    def canonical_path(self) -> Path:
        """The file's real path (symlinks resolved): the identity used for lock and store keys."""
        return Path(os.path.realpath(self.path))

    @property
    def base_dir(self) -> Path:
        """The folder relative paths in the front matter are resolved against."""
        return self.path.parent

    def render_prompt(
        self, *, issue: Issue, attempt: int | None = None, retry_kind: RetryKind | None = None
    ) -> str:
        """The first-turn prompt for one run (see :class:`PromptTemplate`)."""
        return self.prompt.render(issue=issue, attempt=attempt, retry_kind=retry_kind)


def select_workflow_path(
    explicit: str | os.PathLike[str] | None = None, *, cwd: Path | None = None
) -> Path:
    """The explicit path if given, else ``WORKFLOW.md`` in the working directory; absolute."""
    base = cwd if cwd is not None else Path.cwd()
    chosen = Path(explicit) if explicit is not None else Path(DEFAULT_WORKFLOW_FILENAME)
    chosen = chosen.expanduser()
    return Path(os.path.normpath(chosen if chosen.is_absolute() else base / chosen))


def _read(path: Path) -> tuple[bytes, WorkflowStamp]:
    try:
        with path.open("rb") as handle:
            stat = os.fstat(handle.fileno())
            # NB: one byte past the limit is enough to know the file is too large.
            content = handle.read(MAX_WORKFLOW_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or exc.__class__.__name__
        raise MissingWorkflowFile(
            f"cannot read workflow file {path} ({reason}); pass the path of a readable "
            f"WORKFLOW.md, or run from the folder that holds one",
        ) from exc
    stamp = WorkflowStamp(
        mtime_ns=stat.st_mtime_ns, size=len(content), sha256=hashlib.sha256(content).hexdigest()
    )
    return content, stamp


def render_prompt(
    workflow: LoadedWorkflow,
    *,
    issue: Issue,
    attempt: int | None = None,
    retry_kind: RetryKind | None = None,
) -> str:
    """``workflow.render_prompt(...)`` as a function (what the runtime passes around)."""
    return workflow.prompt.render(issue=issue, attempt=attempt, retry_kind=retry_kind)


def workflow_stamp(path: str | os.PathLike[str]) -> WorkflowStamp:
    """The file's current stamp (one read and one hash of a small file: fine every tick)."""
    return _read(Path(path))[1]


def load_workflow(
    path: str | os.PathLike[str] | None = None,
    *,
    cli_flags: Mapping[str, str] = _NO_FLAGS,
    cli_features: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    cwd: Path | None = None,
) -> LoadedWorkflow:
    """Load and validate a workflow file; raises a coded :class:`WorkflowError` on any problem.

    ``path`` ``None`` means ``./WORKFLOW.md``; ``environ`` ``None`` means ``os.environ``.
    """
    workflow_path = select_workflow_path(path, cwd=cwd)
    content, stamp = _read(workflow_path)
    if len(content) > MAX_WORKFLOW_BYTES:
        raise WorkflowTooLarge(
            f"{workflow_path} is larger than {MAX_WORKFLOW_BYTES} bytes (limit 1 MiB); keep "
            "long instructions in files the prompt points to"
        )
    try:
        text = decode_workflow_bytes(content, path=workflow_path)
        document = split_front_matter(text)
        front_matter = parse_front_matter(document.front_matter, path=workflow_path)
        resolved = settings_from_mapping(
            front_matter,
            base_dir=workflow_path.parent,
            cli_flags=cli_flags,
            cli_features=cli_features,
            environ=environ,
            origin=str(workflow_path),
        )
        prompt = PromptTemplate(document.body, first_line=document.body_line)
    except RecursionError:
        # NB: the YAML is depth-bounded, but the prompt template parser (and anything else
        # that recurses over outside input) must not crash a command or the daemon either.
        raise WorkflowTooComplex(
            f"{workflow_path} is nested too deeply to load (limit depth {MAX_YAML_DEPTH}); "
            "flatten the front matter or the template"
        ) from None
    return LoadedWorkflow(
        path=workflow_path,
        settings=resolved.settings,
        prompt_template=document.body,
        prompt=prompt,
        raw=front_matter,
        warnings=resolved.warnings,
        flag_sources=resolved.flag_sources,
        feature_sources=resolved.feature_sources,
        stamp=stamp,
    )


def settings_from_mapping(
    front_matter: Mapping[Any, Any],
    *,
    base_dir: Path,
    cli_flags: Mapping[str, str] = _NO_FLAGS,
    cli_features: Sequence[str] = (),
    environ: Mapping[str, str] | None = None,
    origin: str = "front matter",
) -> ResolvedSettings:
    """Typed settings from a decoded front-matter mapping, with flags applied (no file I/O).

    ``base_dir`` anchors relative paths; ``origin`` names the document in log lines.
    """
    env = os.environ if environ is None else environ
    data = {str(key): value for key, value in front_matter.items()}
    front_matter_flags = data.pop(FLAGS_KEY, None)
    front_matter_features = data.pop(FEATURES_KEY, None)

    written_flag_sections = sorted(k for k in FLAG_ONLY_SECTIONS if data.get(k) is not None)
    if written_flag_sections:
        first = written_flag_sections[0]
        raise FlagOnlySection(
            f"{', '.join(written_flag_sections)} cannot be written as a section; set its keys "
            f"as flags instead, e.g. flags: {{{first}.{_first_field(first)}: ...}} (or "
            f"features: [{_feature_for(first)}])",
            key_path=first,
        )

    warnings: list[str] = []
    known: dict[str, Any] = {}
    for key, value in data.items():
        if key in TOP_LEVEL_SECTIONS:
            known[key] = value
        else:
            warnings.append(f"unknown top-level key {key!r} ignored")
            logger.warning("ignoring unknown top-level key key=%s workflow=%s", key, origin)

    flags = resolve_flags(
        cli_flags=cli_flags,
        cli_features=cli_features,
        front_matter_flags=front_matter_flags,
        front_matter_features=front_matter_features,
        environ=env,
    )
    resolved = resolve_front_matter(
        {k: v for k, v in known.items() if k not in FLAG_ONLY_SECTIONS},
        base_dir=base_dir,
        environ=env,
    )
    resolved.update(flags.section_values())
    try:
        settings = WorkflowSettings.model_validate(resolved)
    except pydantic.ValidationError as exc:
        raise InvalidWorkflowConfig(_problems(exc, flags)) from None
    # Coded warnings of a valid configuration (``model_unpriced``): reported, never fatal.
    warnings.extend(settings.pricing_warnings())
    typed = {
        key: getattr(getattr(settings, key.split(".", 1)[0]), key.split(".", 1)[1])
        for key in KNOWN_FLAGS
    }
    flags = flags.with_values(typed)
    return ResolvedSettings(
        settings=settings,
        warnings=tuple(warnings),
        flag_sources=flags.flags,
        feature_sources=flags.features,
    )


def _first_field(section: str) -> str:
    return next(key for key in KNOWN_FLAGS if key.startswith(f"{section}.")).split(".", 1)[1]


def _feature_for(section: str) -> str:
    for name, feature in FEATURES.items():
        if any(key.startswith(f"{section}.") for key in feature.implies):
            return name
    return "..."


_MESSAGE_PREFIXES = ("Value error, ", "Assertion failed, ")


def _problems(exc: pydantic.ValidationError, flags: FlagResolution) -> list[ConfigProblem]:
    problems: list[ConfigProblem] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        key_path = ".".join(str(part) for part in loc)
        reason = str(error["msg"])
        for prefix in _MESSAGE_PREFIXES:
            reason = reason.removeprefix(prefix)
        code: str = InvalidWorkflowConfig.code
        kind = error["type"]
        if kind == "extra_forbidden":
            section = model_at(loc[:-1])
            known = ", ".join(section.model_fields) if section is not None else ""
            reason = "unknown key; check the spelling"
            if known:
                reason = f"{reason} (known keys: {known})"
        elif kind == "missing":
            reason = "is required"
        elif kind in CODED_CONFIG_ERRORS:
            code = kind
            key_path = str((error.get("ctx") or {}).get("key_path") or key_path)
        elif loc == ("tracker", "kind") and kind == "enum":
            code = ErrorCode.UNSUPPORTED_TRACKER_KIND
            reason = (
                f"{error.get('input')!r} is not a supported tracker kind; use one of "
                f"{', '.join(sorted(SUPPORTED_TRACKER_KINDS))}"
            )
        if loc and loc[0] in FLAG_ONLY_SECTIONS:
            flag = flags.flags.get(".".join(str(part) for part in loc[:2]))
            key_path = f"flags.{key_path}"
            if flag is not None and flag.source is not FlagSource.DEFAULT:
                reason = f"{reason} (set by {flag.describe_source()})"
        problems.append(ConfigProblem(key_path, reason, code))
    return problems
