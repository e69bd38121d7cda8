"""The coded errors of loading WORKFLOW.md, resolving its configuration and rendering prompts.

A user causes every one of these by what they wrote (or did not write) in WORKFLOW.md, on the
command line or in the environment, so each has a stable ``code`` that ``lorenz validate``
prints, the docs list and the tests pin. Messages are one line and say what to do.

Most failures are a single problem. Schema validation can find many at once, so
:class:`InvalidWorkflowConfig` carries one :class:`ConfigProblem` per failure, each with its own
key path (and, rarely, its own code: an unknown ``tracker.kind`` is reported as
``unsupported_tracker_kind`` even though pydantic found it). :meth:`WorkflowError.problems`
flattens either shape into printable lines, so callers never special-case the aggregate.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence

from lorenz.codes import ErrorCode
from lorenz.model import LorenzError


@dataclasses.dataclass(frozen=True, slots=True)
class ConfigProblem:
    """One thing wrong with the configuration, at one key path."""

    key_path: str
    """Dotted path of the offending key (``agent.max_turns``, ``flags.claim_store.backend``);
    empty when the problem is about the document as a whole."""
    reason: str
    """What is wrong and, where it helps, what to write instead."""
    code: str = ErrorCode.INVALID_WORKFLOW_CONFIG
    """The stable code this line is reported under."""

    def format(self) -> str:
        """``<code> <key path>: <reason>`` (the ``lorenz validate`` line format)."""
        where = f" {self.key_path}" if self.key_path else ""
        return f"{self.code}{where}: {self.reason}"


class WorkflowError(LorenzError):
    """Base of the errors caused by the workflow file, its flags or its environment.

    They are configuration errors: the CLI exits 2 on them, and the runtime refuses to start
    (or, on reload, keeps the last good configuration).
    """

    code = ErrorCode.WORKFLOW_ERROR

    def problems(self) -> list[ConfigProblem]:
        """This error as printable problems (one, unless it aggregates several)."""
        return [ConfigProblem(self.key_path or "", self.message, self.code)]


class MissingWorkflowFile(WorkflowError, OSError):
    """The workflow file cannot be read (absent, a directory, no permission).

    Also an :class:`OSError`, so code that guards file access with ``except OSError`` sees it.
    """

    code = ErrorCode.MISSING_WORKFLOW_FILE


class WorkflowParseError(WorkflowError):
    """The file is not UTF-8 text, or its YAML front matter is not valid YAML."""

    code = ErrorCode.WORKFLOW_PARSE_ERROR


class WorkflowTooLarge(WorkflowError):
    """The workflow file is larger than the limit (1 MiB); it is not parsed."""

    code = ErrorCode.WORKFLOW_TOO_LARGE


class WorkflowTooComplex(WorkflowError):
    """The front matter nests deeper than 64 levels or has more than 100,000 values once YAML
    aliases are expanded (an alias bomb); the message names the limit."""

    code = ErrorCode.WORKFLOW_TOO_COMPLEX


class WorkflowLoadTimeout(WorkflowError):
    """Loading the workflow took longer than the reload time bound (10 s); the last good
    workflow stays in force."""

    code = ErrorCode.WORKFLOW_LOAD_TIMEOUT


class WorkflowFrontMatterNotAMap(WorkflowError):
    """The front matter is valid YAML but not a mapping (a list, a string, a number)."""

    code = ErrorCode.WORKFLOW_FRONT_MATTER_NOT_A_MAP


class TemplateParseError(WorkflowError):
    """The prompt body is not a valid Liquid template; the run attempt fails."""

    code = ErrorCode.TEMPLATE_PARSE_ERROR


class TemplateRenderError(WorkflowError):
    """Rendering the prompt failed (unknown variable or filter, bad filter argument); the run
    attempt fails."""

    code = ErrorCode.TEMPLATE_RENDER_ERROR


class InvalidWorkflowConfig(WorkflowError):
    """The front matter (or a flag value) does not fit the configuration schema."""

    code = ErrorCode.INVALID_WORKFLOW_CONFIG

    def __init__(self, problems: Sequence[ConfigProblem]):
        self.config_problems: tuple[ConfigProblem, ...] = tuple(problems)
        joined = "; ".join(
            f"{p.key_path} {p.reason}" if p.key_path else p.reason for p in self.config_problems
        )
        first = self.config_problems[0].key_path if self.config_problems else None
        super().__init__(joined or "invalid configuration", key_path=first or None)

    def problems(self) -> list[ConfigProblem]:
        return list(self.config_problems)


class UnsupportedTrackerKind(WorkflowError):
    """``tracker.kind`` names no tracker adapter this build ships."""

    code = ErrorCode.UNSUPPORTED_TRACKER_KIND


class FlagOnlySection(WorkflowError):
    """A flag-only section (``claim_store``, ``daemon``) was written directly in front matter."""

    code = ErrorCode.FLAG_ONLY_SECTION


class UnknownFlag(WorkflowError):
    """A flag key (CLI, front matter ``flags:`` or ``LORENZ_FLAG_*``) is not a known flag."""

    code = ErrorCode.UNKNOWN_FLAG


class UnknownFeature(WorkflowError):
    """A feature name (CLI, front matter ``features:`` or ``LORENZ_FEATURE_*``) is unknown."""

    code = ErrorCode.UNKNOWN_FEATURE


class InvalidFlagSyntax(WorkflowError):
    """A ``--flag`` argument is not ``key=value``."""

    code = ErrorCode.INVALID_FLAG_SYNTAX


class InvalidFeatureValue(WorkflowError):
    """A ``LORENZ_FEATURE_*`` variable is neither truthy (1/true/yes/on) nor falsy
    (0/false/no/off)."""

    code = ErrorCode.INVALID_FEATURE_VALUE


class MissingTrackerKind(WorkflowError):
    """No ``tracker.kind``: nothing can be dispatched."""

    code = ErrorCode.MISSING_TRACKER_KIND


class MissingTrackerApiKey(WorkflowError):
    """A linear, github or jira tracker has no API token after ``$VAR`` and fallback resolution."""

    code = ErrorCode.MISSING_TRACKER_API_KEY


class MissingTrackerProjectSlug(WorkflowError):
    """A linear or jira tracker has no ``tracker.project_slug``."""

    code = ErrorCode.MISSING_TRACKER_PROJECT_SLUG


class MissingTrackerRepository(WorkflowError):
    """A github tracker has no ``tracker.repository``."""

    code = ErrorCode.MISSING_TRACKER_REPOSITORY


class MissingTrackerPath(WorkflowError):
    """A files tracker has no ``tracker.path``."""

    code = ErrorCode.MISSING_TRACKER_PATH


class MissingTrackerEndpoint(WorkflowError):
    """A jira tracker has no ``tracker.endpoint`` (Jira Cloud has no one site for everyone)."""

    code = ErrorCode.MISSING_TRACKER_ENDPOINT


class MissingTrackerEmail(WorkflowError):
    """A jira tracker has no account email after ``$VAR`` and fallback resolution."""

    code = ErrorCode.MISSING_TRACKER_EMAIL


class MissingAgentCommand(WorkflowError):
    """The selected agent kind has a blank ``command``."""

    code = ErrorCode.MISSING_AGENT_COMMAND


class SshClientMissing(WorkflowError):
    """``worker.ssh_hosts`` is set, but there is no ``ssh`` program on this machine's PATH."""

    code = ErrorCode.SSH_CLIENT_MISSING


class SshWorktreeUnsupported(WorkflowError):
    """``worker.ssh_hosts`` is set with ``workspace.kind: worktree``; remote workspaces are
    plain directories (clone in ``hooks.after_create``)."""

    code = ErrorCode.SSH_WORKTREE_UNSUPPORTED


def _all_error_classes(root: type[WorkflowError]) -> Iterable[type[WorkflowError]]:
    for sub in root.__subclasses__():
        yield sub
        yield from _all_error_classes(sub)


ERROR_CLASSES: tuple[type[WorkflowError], ...] = tuple(_all_error_classes(WorkflowError))
"""Every coded workflow error, in declaration order (the docs' error table is built from it)."""
