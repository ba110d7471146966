"""The agent's prompts: ``skills/*.md`` loaded once and checked at load time.

Skill file format (markdown, read top to bottom)::

    <!-- comments for maintainers (removed before sending) -->
    # System
    static instructions (no placeholders: the prefix stays identical between calls, so the
    local server's prompt cache can reuse it)
    # User
    the variable part, with $placeholders (string.Template syntax: $name or ${name}; $$ is a
    literal dollar; JSON braces need no escaping)

:data:`SKILL_FIELDS` declares the placeholders every node fills.  :func:`load_skills` fails (at
import of the first caller) when a file is missing, its system part holds a placeholder, or the
placeholders of its user part differ from the declared ones in either direction.  :func:`render`
fails when a caller passes a different set of values.
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

SKILLS_DIR = Path(__file__).resolve().parent / "skills"

SKILL_FIELDS: dict[str, frozenset[str]] = {
    "detect_prompt_injection": frozenset({"user_input"}),
    "classify_and_route": frozenset({"question"}),
    "plan_synthesis": frozenset({"objective"}),
    "query_rewrite": frozenset({"question"}),
    "synthesize_and_cite": frozenset({"question", "passages"}),
    "adaptive_replan": frozenset({"objective", "progress"}),
    "mc_select": frozenset({"question", "choices", "evidence"}),
    "mc_select_strict": frozenset({"question", "choices", "evidence"}),
    "extract_quotes": frozenset({"question", "passages"}),
    "verify_quotes": frozenset({"question", "quotes"}),
    "compose_from_quotes": frozenset({"question", "quotes", "feedback"}),
    "review_answer": frozenset({"claims"}),
    "grade_answer": frozenset({"question", "expectation", "answer"}),
}
"""Skill name -> the placeholders its node fills (exactly those must appear in the file)."""

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
    body = _COMMENT.sub("", text)
    parts = _SECTION.split(body)
    # parts = [preamble, "System", system_text, "User", user_text]
    if len(parts) != 5 or parts[1] != "System" or parts[3] != "User":
        raise SkillError(f"skill {name}: needs exactly one '# System' then one '# User' heading")
    system, user = parts[2].strip(), parts[4].strip()
    if not system or not user:
        raise SkillError(f"skill {name}: empty System or User section")
    sys_template = string.Template(system)
    if not sys_template.is_valid() or sys_template.get_identifiers():
        raise SkillError(
            f"skill {name}: the System section must be static (found "
            f"{sys_template.get_identifiers() or 'an invalid $'}); use $$ for a literal dollar"
        )
    system = sys_template.substitute({})  # turns $$ into $
    template = string.Template(user)
    if not template.is_valid():
        raise SkillError(f"skill {name}: invalid $placeholder syntax (use $$ for a literal dollar)")
    found = set(template.get_identifiers())
    if found != fields:
        raise SkillError(
            f"skill {name}: placeholders in the file {sorted(found)} != filled by the node "
            f"{sorted(fields)} (missing {sorted(fields - found)}, unused {sorted(found - fields)})"
        )
    return Skill(name=name, system=system, user=template, fields=fields)


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


def get_skill(name: str) -> Skill:
    skills = load_skills()
    if name not in skills:
        raise SkillError(f"unknown skill {name!r}; known: {', '.join(skills)}")
    return skills[name]


def render(name: str, **values: Any) -> list[tuple[str, str]]:
    """The (system, user) messages of skill ``name`` with ``values`` filled in."""
    return get_skill(name).messages(**values)


# ------------------------------------------------------------------------------------------------
# Quoting untrusted text (retrieved passages, evidence, user input) as data
# ------------------------------------------------------------------------------------------------

_TAGS = re.compile(r"</?\s*(passage|evidence|user_input|data)\b[^>]*>", re.IGNORECASE)


def neutralize(text: str) -> str:
    """Remove our quoting tags from untrusted text so it cannot close the quote early."""
    return _TAGS.sub("", text or "")


def quote_passages(docs: Sequence[Mapping[str, Any]], max_chars: int = 900) -> str:
    """Passages numbered ``[Source N]`` (1-based), each wrapped in <passage> tags as quoted data."""
    blocks = []
    for i, doc in enumerate(docs, 1):
        title = neutralize(str(doc.get("title") or "")).strip()
        text = neutralize(" ".join(str(doc.get("text") or "").split()))
        if len(text) > max_chars:
            text = text[: max_chars - 1].rstrip() + "…"
        head = f"[Source {i}] {title}".rstrip()
        blocks.append(f'<passage n="{i}">\n{head}\n{text}\n</passage>')
    return "\n".join(blocks) if blocks else "(no passages were found)"


def quote(tag: str, text: str) -> str:
    """``text`` wrapped as ``<tag>…</tag>`` data, with our tags removed from inside it."""
    return f"<{tag}>\n{neutralize(text).strip()}\n</{tag}>"
