"""The agent's prompts (``skills/*.md``, checked at load), structured outputs and call table.

A skill file holds ``<!-- maintainer comments -->``, a ``# System`` section with no placeholders
(a static prefix the local server's prompt cache reuses), then a ``# User`` section with
string.Template $placeholders ($$: a literal dollar), exactly those of :data:`SKILL_FIELDS`."""

from __future__ import annotations

import re
import string
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, get_args

from pydantic import BaseModel, Field, field_validator

if TYPE_CHECKING:
    from llm_config import LLMClient, LLMResult

SKILLS_DIR = Path(__file__).resolve().parent / "skills"

SKILL_FIELDS: dict[str, frozenset[str]] = {
    "detect_prompt_injection": frozenset({"user_input"}),
    "replan": frozenset({"objective", "findings", "candidates"}),
    "classify_and_route": frozenset({"question"}),
    "plan_synthesis": frozenset({"objective", "candidates"}),
    "query_rewrite": frozenset({"question"}),
    "apply_rule": frozenset({"issue", "rule", "facts"}),
    "bottom_line": frozenset({"question", "findings"}),
    "irac_ceiling": frozenset({"question", "passages"}),
    "mc_select": frozenset({"question", "choices", "evidence"}),
    "mc_select_strict": frozenset({"question", "choices", "evidence"}),
    "verify_quotes": frozenset({"issue", "quotes"}),
    "grade_answer": frozenset({"question", "expectation", "answer"}),
    "grade_abstention": frozenset({"question", "answer"}),
    "hypothetical_passage": frozenset({"question"}),
}
"""Skill name -> the placeholders its node fills."""

_COMMENT = re.compile(r"<!--.*?-->", re.DOTALL)
_SECTION = re.compile(r"^# (System|User)[ \t]*$", re.MULTILINE)


class SkillError(ValueError):
    """A skill file is missing or does not match the placeholders its node fills."""


@dataclass(frozen=True)
class Skill:
    name: str
    system: str
    user: string.Template
    fields: frozenset[str]

    def messages(self, **values: Any) -> list[tuple[str, str]]:
        """(system, user) message tuples with the placeholders filled."""
        given = set(values)
        if given != self.fields:
            missing, extra = sorted(self.fields - given), sorted(given - self.fields)
            raise SkillError(f"skill {self.name}: missing values {missing}, unexpected {extra}")
        user = self.user.substitute({k: str(v) for k, v in values.items()})
        return [("system", self.system), ("user", user)]


def parse_skill(name: str, text: str, fields: frozenset[str]) -> Skill:
    """Parse and validate one skill file's text."""
    parts = _SECTION.split(_COMMENT.sub("", text))  # [preamble, "System", text, "User", text]
    if len(parts) != 5 or parts[1] != "System" or parts[3] != "User":
        raise SkillError(f"skill {name}: needs exactly one '# System' then one '# User' heading")
    system, user = string.Template(parts[2].strip()), string.Template(parts[4].strip())
    if not system.template or not user.template:
        raise SkillError(f"skill {name}: empty System or User section")
    if not (system.is_valid() and user.is_valid()):
        raise SkillError(f"skill {name}: invalid $placeholder syntax (use $$ for a literal dollar)")
    if ids := system.get_identifiers():
        raise SkillError(f"skill {name}: the System section must be static (found {ids})")
    found = set(user.get_identifiers())
    if found != fields:
        raise SkillError(
            f"skill {name}: placeholders in the file {sorted(found)} != filled by the node "
            f"{sorted(fields)} (missing {sorted(fields - found)}, unused {sorted(found - fields)})"
        )
    return Skill(name=name, system=system.substitute({}), user=user, fields=fields)  # $$ -> $


@lru_cache(maxsize=4)
def load_skills(directory: str | None = None) -> dict[str, Skill]:
    """Every skill of :data:`SKILL_FIELDS`, parsed and validated (once per directory)."""
    folder = Path(directory) if directory else SKILLS_DIR
    skills = {}
    for name, fields in SKILL_FIELDS.items():
        path = folder / f"{name}.md"
        if not path.is_file():
            raise SkillError(f"skill file {path} is missing")
        skills[name] = parse_skill(name, path.read_text(encoding="utf-8"), fields)
    return skills


def render(name: str, **values: Any) -> list[tuple[str, str]]:
    """The (system, user) messages of skill ``name`` with ``values`` filled in."""
    if (skill := load_skills().get(name)) is None:
        raise SkillError(f"unknown skill {name!r}; known: {', '.join(load_skills())}")
    return skill.messages(**values)


# Quoting untrusted text (retrieved passages, evidence, user input) as data.
_TAGS = re.compile(r"</?\s*(passage|evidence|user_input|data)\b[^>]*>", re.IGNORECASE)


def neutralize(text: str) -> str:
    """Remove our quoting tags from untrusted text so it cannot close the quote early."""
    return _TAGS.sub("", text or "")


def quote(tag: str, text: str) -> str:
    """``text`` wrapped as ``<tag>…</tag>`` data, with our tags removed from inside it."""
    return f"<{tag}>\n{neutralize(text).strip()}\n</{tag}>"


EVIDENCE_CHARS = 5000
"""Characters of evidence in an answering prompt (~1,250 tokens: ~17 s on the embedded model)."""
MIN_PASSAGE_CHARS = 400
"""No passage is cut shorter than this, however many there are."""


def format_evidence(docs: Sequence[Mapping[str, Any]], *, max_chars: int = EVIDENCE_CHARS) -> str:
    """The evidence block of every answering mode: ``[N] title`` and text per passage, within
    ``max_chars`` shared equally, each cut at a word boundary."""
    share = max(MIN_PASSAGE_CHARS, max_chars // max(1, len(docs)))
    parts: list[str] = []
    for i, doc in enumerate(docs, 1):
        title = neutralize(str(doc.get("title") or "")).strip()
        text = neutralize(" ".join(str(doc.get("text") or "").split()))
        head = f"[{i}] {title}" if title else f"[{i}]"
        parts.append(f"{head}\n{_cut(text, max(0, share - len(head) - 1))}")
    return "\n\n".join(parts)


def _cut(text: str, limit: int) -> str:
    """``text`` cut at a word boundary to at most ``limit`` characters (with an ellipsis)."""
    if len(text) <= limit:
        return text
    cut = text[: max(0, limit - 1)]
    if " " in cut:
        cut = cut[: cut.rindex(" ")]
    return cut.rstrip(" ,;:") + "…"


# Structured outputs of the agent's calls (a class docstring is its schema's description, which
# the model reads: edit with care).


class InjectionVerdict(BaseModel):
    verdict: Literal["safe", "injection"]
    reason: str = Field(default="", max_length=80)


_ENGLISH_WORDS = (
    "the a an of to in on at is are was were be been for and or not no what when who how why which "
    "does do did can could may must should would will with by from that this it its his her their "
    "my i you he she they if under after before"
)
_FOREIGN_WORDS = (
    "el la los las un una unos del de por para con que qué cuál cuáles cómo es son está en y o "
    "le les des du une est sont dans sur pour avec qui quel quels quelle et ou "
    "der die das den dem des ein eine einer ist sind nicht und oder mit für wie welche "
    "il lo gli della di che è per não uma os as com"
)
_ENGLISH, _FOREIGN = frozenset(_ENGLISH_WORDS.split()), frozenset(_FOREIGN_WORDS.split())


def in_english(text: str) -> bool:
    """Whether a question is in English (that of the sources, skills and embedder): not mostly in
    a non-Latin script, nor with more Romance or German function words than English ones."""
    words = re.findall(r"[^\W\d_]+", text.lower())
    ascii_letters = sum(c.isascii() for w in words for c in w)
    if words and ascii_letters < sum(len(w) for w in words) / 2:
        return False
    foreign = sum(w in _FOREIGN for w in words)
    return foreign < 3 or foreign <= sum(w in _ENGLISH for w in words)


COVERED_AREAS = (
    "torts",
    "contracts",
    "criminal law",
    "criminal procedure",
    "evidence",
    "constitutional law",
    "civil procedure",
    "property",
)
"""The fields of law the starter corpus and the legal taxonomy cover (the MBE subjects)."""
Area = Literal[
    *COVERED_AREAS,
    "family law",
    "tax",
    "securities",
    "intellectual property",
    "immigration",
    "bankruptcy",
    "employment",
    "admiralty",
    "none",
]


class Classification(BaseModel):
    topic: str
    """What the question asks for, in a few words (named first, so that ``legal`` follows it)."""
    area: Area
    """The field of law it belongs to (``none``: not about the law)."""
    legal: bool
    """Whether it asks about the law at all."""
    query_type: Literal["simple", "multi_hop"]
    """Read by nothing, but asked for: without it in the prompt and the reply, the 1.5B read a
    securities and a bankruptcy question as covered fields (open set abstention 73 -> 71/80)."""

    @field_validator("area", mode="before")
    @classmethod
    def _known_area(cls, value: Any) -> str:
        """A field written another way ("Family Law") is that field; one off the list is "none",
        which declines nothing (a provider without JSON-schema mode is not held to the enum)."""
        area = " ".join(str(value).lower().split())
        return area if area in get_args(Area) else "none"


class Plan(BaseModel):
    issues: list[int | str] = Field(min_length=1, max_length=4)
    """The research agenda, most important first: each a candidate doctrine's number (or name)."""


Met = Literal["yes", "no", "unclear"]


class Check(BaseModel):
    """One requirement of a rule and the stated fact that decides it (built in code from a
    :class:`Finding` and the requirement it numbers)."""

    requirement: str = Field(min_length=1)
    fact: str = Field(min_length=1)
    """The fact sentence as the user wrote it, or the model's words for it (at most 120 characters)."""
    met: Met
    support: float | None = None
    """How far the research supports the finding: the cosine of the requirement to the fact that
    decides it (None: no fact decides it)."""


class Finding(BaseModel):
    n: int = Field(ge=1, le=6)
    """The number of the requirement it decides."""
    fact: int | str
    """The number of the fact sentence that decides it (0: none); words are the fact itself."""
    met: Met


class Application(BaseModel):
    """One issue's application (``skills/apply_rule.md``): for each numbered requirement of the
    rule, the stated fact that decides it."""

    checks: list[Finding] = Field(min_length=1, max_length=6)


class BottomLine(BaseModel):
    """The answer to the question as asked (``skills/bottom_line.md``): yes / no / unclear and
    the number of the issue conclusion that decides it (0: none)."""

    answer: Met
    conclusion: int = Field(ge=0, le=20)


class QuoteVerdict(BaseModel):
    n: int = Field(ge=1, le=8)
    """The number of the sentence judged."""
    verdict: Literal["ok", "other_doctrine", "incomplete"]


class GateVerdicts(BaseModel):
    """The grounding gate's verdicts (``skills/verify_quotes.md``): one per candidate rule sentence."""

    verdicts: list[QuoteVerdict] = Field(min_length=1, max_length=8)


class Irac(BaseModel):
    """The fact-pattern ceiling's one-call analysis (``skills/irac_ceiling.md``, eval only)."""

    rule: str = Field(min_length=1, max_length=400)
    application: str = Field(min_length=1, max_length=500)
    answer: Literal["yes", "no"]
    conclusion: str = Field(min_length=1, max_length=300)


class Rewrite(BaseModel):
    primary: str = Field(min_length=2, max_length=400)
    alternatives: list[str] = Field(default_factory=list)


class Replan(BaseModel):
    """The adaptive research's next move after a step (``skills/replan.md``)."""

    action: Literal["next_step", "retry", "complete"]
    issue: int | str = ""
    """With next_step: a candidate's number, or a doctrine's name."""
    why: str = ""


# The call table: per role its skill, output schema and token budget.


@dataclass(frozen=True)
class Call:
    """One kind of LLM call.  ``max_tokens`` is the reply budget on the embedded model (~15 output
    tokens/s end to end); ``max_tokens_api`` a larger one for API models where it pays."""

    skill: str
    schema: type[BaseModel] | None
    max_tokens: int
    max_tokens_api: int | None = None


CALLS: dict[str, Call] = {
    "injection": Call("detect_prompt_injection", InjectionVerdict, 60),
    "classify": Call("classify_and_route", Classification, 40),
    "plan": Call("plan_synthesis", Plan, 80),
    "rewrite": Call("query_rewrite", Rewrite, 110),
    "replan": Call("replan", Replan, 60),
    "apply": Call("apply_rule", Application, 160),
    "bottom_line": Call("bottom_line", BottomLine, 30),
    "verify": Call("verify_quotes", GateVerdicts, 90),
    "irac": Call("irac_ceiling", Irac, 400),
    "mc_select": Call("mc_select", None, 200, max_tokens_api=500),
    "mc_select_strict": Call("mc_select_strict", None, 12),
    "hyde": Call("hypothetical_passage", None, 130),
}
Role = Literal[*CALLS]


def call(
    client: LLMClient, role: Role, accept: Callable[[str], bool] | None = None, **values: Any
) -> LLMResult:
    """The ``role`` call: its skill with ``values``, its schema and token budget.  Transport
    failures raise ``llm_config.LLMCallError``; an unparseable reply has ``parsed is None``."""
    spec = CALLS[role]
    api = spec.max_tokens_api is not None and not client.is_local(role)
    budget = spec.max_tokens_api if api else spec.max_tokens
    messages = render(spec.skill, **values)
    return client.invoke(messages, role=role, schema=spec.schema, max_tokens=budget, accept=accept)
