"""Passage filters (jurisdiction, court, authority type, date), applied inside dense and BM25
search so a filtered search never returns a passage outside the filter; see docs/ARCHITECTURE.md,
"Passage filters" and "Your own documents"."""

from __future__ import annotations

import datetime
import functools
import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from settings import Settings, SettingsError

AUTHORITY_TYPES = ("constitution", "statute", "regulation", "court_rule", "case", "secondary")
"""The kinds of authority a passage can be (metadata ``authority_type``)."""
DOCUMENT_KINDS = ("statute", "opinion", "brief")
"""The layouts of the user's documents (metadata ``kind``, ``documents._guess_kind``): each
decides how a document is cut and pinned; passage tables have none."""

_DATE = re.compile(r"^(\d{4})(?:-(\d{1,2}))?(?:-(\d{1,2}))?$")
_FEDERAL_NAMES = ("us", "usa", "federal", "fed", "unitedstates", "unitedstatesofamerica")


def parse_date(value: str, *, end: bool = False) -> int:
    """``YYYY``, ``YYYY-MM`` or ``YYYY-MM-DD`` as a ``YYYYMMDD`` integer (``date_int``); a partial
    date is its first day, or its last with ``end`` ("2001" -> 20010101, or 20011231)."""
    m = _DATE.match(value.strip())
    if not m:
        raise ValueError(f"{value!r} is not a date: use YYYY, YYYY-MM or YYYY-MM-DD")
    year, month, day = m.groups()
    mm = int(month) if month else (12 if end else 1)
    dd = int(day) if day else (31 if end else 1)
    try:  # a partial date's last day may be "31": an inclusive bound, not a calendar date
        datetime.date(int(year), mm, dd if day else 1)
    except ValueError:
        raise ValueError(f"{value!r} is not a date") from None
    return int(year) * 10000 + mm * 100 + dd


def _key(value: str) -> str:
    return re.sub(r"[^a-z]", "", value.lower())


@functools.cache
def _states() -> dict[str, str]:
    """USPS code -> name of each state and territory (courts-db's list)."""
    import courts_db

    states = json.loads((Path(courts_db.__file__).parent / "data" / "states.json").read_text())
    return {code: name for code, name in states.items() if len(code) == 2}


@functools.cache
def _jurisdictions() -> dict[str, str]:
    """Name, USPS code or reporter abbreviation (letters only, lower case) -> USPS code or US."""
    import reporters_db

    table = dict.fromkeys(_FEDERAL_NAMES, "US")
    for code, name in _states().items():
        table[_key(code)] = table[_key(name)] = code
    states = {_key(name) for name in _states().values()}
    for abbr, name in reporters_db.STATE_ABBREVIATIONS.items():
        if _key(name) in states:
            table.setdefault(_key(abbr), table[_key(name)])
    return table


def jurisdiction_of(value: str) -> str | None:
    """``US`` for the federal system, a state's USPS code (from courts-db's and reporters-db's
    names and abbreviations: ``Texas``, ``tex``, ``Tex.``, ``tx`` -> TX), else None."""
    return _jurisdictions().get(_key(value or ""))


@functools.cache
def _state_names() -> re.Pattern[str]:
    """A state's full name as a proper noun ("Ohio", "New York"), or in capitals as a heading
    writes it ("COLORADO REVISED STATUTES"), longest names first."""
    names = sorted(
        {f(n) for n in _states().values() for f in (str.title, str.upper)}, key=len, reverse=True
    )
    return re.compile(r"\b(" + "|".join(map(re.escape, names)) + r")\b")


def state_named(text: str) -> str | None:
    """The USPS code of the first state ``text`` names in full ("Vermont", "New York")."""
    m = _state_names().search(text)
    return _jurisdictions()[_key(m.group(1))] if m else None


_LAW_WORDS = r"(?:law|laws|statutes?|code|legislature)"
_OWNED = re.compile(
    rf"['’]s?\s+(?:[\w-]+\s+){{0,3}}(?:{_LAW_WORDS}|acts?|rules?|regulations?|requirements?"
    r"|deadlines?|limits?|standards?)\b"
)
"""A state's own law in the possessive ("Arizona's adverse possession statute", "Illinois' lemon
law"); not its courts, nor a person named for a state ("Can Georgia's landlord keep ...?")."""
_HAS_LAW = re.compile(rf"\s+(?:have|has)\s+(?:[\w-]+\s+){{0,3}}{_LAW_WORDS}\b")
"""A state that has a law: "Does Pennsylvania have a law that ...", "Texas has a statute ..."."""
_RULES = re.compile(r"\b(?:does|do)$")
_RULE_VERBS = re.compile(r"\s+(?:let|allow|permit|require|forbid)\b")
"""What a state's law does, asked with "does": "Does Virginia require sellers ..." ("Can Texas
require ...?" asks what a state may do: a party)."""
_FORUM = re.compile(r"\b(?:sue|sued|suing)\s+(?:[\w-]+\s+){0,2}in$")
"""Where to sue ("Can I sue him in New York?"): a forum, whose jurisdiction is general law."""
_FEDERAL_TEST = re.compile(r"\b(?:violates?|unconstitutional|constitutional|preempt\w*)\b", re.I)
"""A state's law tested against federal law ("Does Alabama's ID law violate the Voting Rights Act?")."""


def jurisdiction_asked(asked: str) -> tuple[str, str] | None:
    """(name, USPS code) of the state whose law a question asks about ("Ohio law", "under Ohio
    law", "Does Ohio require ..."), else None: not a state named only in the facts, acting as a
    party or a forum, nor a state's law tested against federal law (``_FEDERAL_TEST``)."""
    if _FEDERAL_TEST.search(asked):
        return None
    for m in _state_names().finditer(asked):
        before = asked[: m.start()].rstrip().lower()
        after = asked[m.end() :].lower()
        if (
            re.match(rf"\s*{_LAW_WORDS}\b", after)
            or _OWNED.match(after)
            or _HAS_LAW.match(after)
            or (_RULES.search(before) and _RULE_VERBS.match(after))
            or (re.search(r"\b(?:in|under)$", before) and not _FORUM.search(before))
        ):
            return m.group(1), _jurisdictions()[_key(m.group(1))]
    return None


_COUNTRIES = (
    "France=French;Germany=German;England=English;United Kingdom,UK,Britain=British;"
    "Scotland=Scottish;Ireland=Irish;Canada=Canadian;Mexico=Mexican;Australia=Australian;"
    "New Zealand=New Zealand;India=India;China=Chinese;Japan=Japanese;Korea=Korean;"
    "Brazil=Brazilian;Argentina=Argentine;Spain=Spanish;Portugal=Portuguese;Italy=Italian;"
    "Netherlands=Dutch;Belgium=Belgian;Switzerland=Swiss;Austria=Austrian;Sweden=Swedish;"
    "Norway=Norwegian;Denmark=Danish;Poland=Polish;Greece=Greek;Russia=Russian;Israel=Israeli;"
    "Egypt=Egyptian;Saudi Arabia=Saudi;Iran=Iranian;Pakistan=Pakistani;Nigeria=Nigerian;"
    "South Africa=South African;Singapore=Singaporean;Philippines=Philippine;European Union,EU=EU"
)
"""Countries whose law the sources cannot hold ("names=demonym;..."); not "Indian law" (the US
federal law on tribes) nor "English common law", where US law comes from."""


@functools.cache
def _foreign() -> tuple[re.Pattern[str], dict[str, str]]:
    """The pattern of a country or demonym whose law is asked for, and name -> demonym."""
    demonym, countries = {}, []
    for entry in _COUNTRIES.split(";"):
        names, adjective = entry.split("=")
        countries += names.split(",")
        demonym.update(dict.fromkeys([*names.split(","), adjective], adjective))
    alts = "|".join(map(re.escape, sorted(demonym, key=len, reverse=True)))
    places = "|".join(map(re.escape, sorted(countries, key=len, reverse=True)))
    return re.compile(
        rf"(?i:\bunder|\baccording\s+to|^\s*in)\s+(?:the\s+)?(?:laws?\s+of\s+(?:the\s+)?)?"
        rf"({alts})\b(?!\s+common\b)|\b({alts})\s+(?:law|laws|statutes?|code|legislation)\b"
        rf"|(?i:\b(?:an?|the|my|your|his|her|their|our)\s+((?:[\w-]+\s+){{1,2}})in\s+(?:the\s+)?)"
        rf"({places})\b|\bthe\s+((?:[A-Z][\w-]*\s+){{1,3}})of\s+(?:the\s+)?({places})\b"
    ), demonym


_PARTICIPLE = re.compile(r"\w+ed|made|sold|built|written|held|born|bought|done|paid|sent|given")
"""A word between an article and "in <country>" that makes the country where something happened
("a contract made in France"), not where a party is ("an employer in Sweden")."""
_FOREIGN_FORUM = re.compile(r"\b(?:sue|sued|suing|suit|court|courts|jurisdiction)\b", re.I)


def foreign_law_asked(asked: str) -> str | None:
    """The demonym ("French") of the country whose law ``asked`` asks for: under its law ("Under
    French law", "under the law of England"), the country first ("In Germany, can ..."), its law
    named ("What does Canadian law say ..."), one of its institutions, a party there; else None."""
    pattern, demonym = _foreign()
    for m in pattern.finditer(asked):
        if m.group(6):  # one of its institutions ("the Council of the European Union")
            if _FOREIGN_FORUM.search(asked[: m.start()] + asked[m.end() :]):
                continue  # its judgment enforced here, or suing it here
            return demonym[m.group(6)]
        if m.group(4):  # a party in the country ("Can an employer in Sweden fire ...?")
            gap = m.group(3).lower().split()
            if _FOREIGN_FORUM.search(asked) or any(_PARTICIPLE.fullmatch(w) for w in gap):
                continue  # where to sue, or where something was done
            return demonym[m.group(4)]
        if m.group(1) != "English" or asked[m.end() :].lstrip().startswith("law"):
            return demonym[m.group(1) or m.group(2)]  # not "in English", the language
    return None


def normalize_jurisdiction(value: str) -> str:
    """:func:`jurisdiction_of`, raising ValueError for a value that names none."""
    if (code := jurisdiction_of(value)) is None:
        raise ValueError(f"unknown jurisdiction {value!r}: use US (federal) or a state: TX, Texas")
    return code


def normalize_court(value: str) -> str:
    """A courts-db court id, lower case, raising ValueError for one courts-db does not know."""
    import courts_db

    court = value.strip().lower()
    if not courts_db.find_court_by_id(court):
        raise ValueError(f"unknown court {value!r}: use a courts-db id (scotus, ca9, tex)")
    return court


def legacy_authority_type(pid: str, source: str) -> str:
    """The authority type of a passage-table row (no ``authority_type``) from its id and source."""
    pid, source = pid.lower(), source.lower()
    if pid.startswith("const") or "constitution" in source:
        return "constitution"
    rule_id = pid.startswith(("fre", "frcp", "frcmp", "rule_"))
    if rule_id or "federal rules" in source or source.endswith(":fre"):
        return "court_rule"
    if pid.startswith("cfr"):
        return "regulation"
    if pid.startswith(("usc", "ucc", "statute")) or "u.s.c" in source or source.endswith(":ucc"):
        return "statute"
    if pid.startswith(("caselaw", "holding")) or "caselaw" in source or "holding" in source:
        return "case"
    return "secondary"


def attributes(pid: str, source: str, meta: Mapping[str, Any]) -> dict[str, Any]:
    """A passage's jurisdiction, court, authority_type and date_int (None: unknown)."""
    kind = str(meta.get("authority_type") or "") or legacy_authority_type(pid, source)
    jurisdiction = str(meta.get("jurisdiction") or "").upper() or None
    federal = ("federal rules", "u.s.c", "constitution")  # passage-table sources of federal law
    if jurisdiction is None and any(s in source.lower() for s in federal):
        jurisdiction = "US"
    date = meta.get("date_int")
    return {
        "jurisdiction": jurisdiction,
        "court": str(meta.get("court") or "").lower() or None,
        "authority_type": kind,
        "date_int": int(date) if isinstance(date, int | float) and date else None,
    }


def _values(raw: str) -> list[str]:
    return [v.strip() for v in (raw or "").split(",") if v.strip()]


def _named(name: str) -> str:
    """A filter as both its flag and its setting name it, for an error: "--after / FILTER_AFTER"."""
    return f"--{name.replace('_', '-')} / FILTER_{name.upper()}"


@dataclass(frozen=True)
class PassageFilter:
    """What a search may return; the empty filter admits everything (and is falsy)."""

    jurisdictions: frozenset[str] = frozenset()
    courts: frozenset[str] = frozenset()
    source_types: frozenset[str] = frozenset()
    after: int | None = None
    """Earliest ``date_int`` admitted (inclusive)."""
    before: int | None = None
    """Latest ``date_int`` admitted (inclusive)."""

    @classmethod
    def from_settings(cls, s: Settings) -> PassageFilter:
        """The filter of ``s`` (FILTER_* settings); bad values raise :class:`SettingsError`."""
        f = s.filters

        def parse(name: str, read: Callable[[str], Any]) -> Any:
            try:
                return read(getattr(f, name).strip())
            except ValueError as exc:
                raise SettingsError(f"{_named(name)}: {exc}") from None

        jurisdictions = parse(
            "jurisdiction", lambda r: frozenset(map(normalize_jurisdiction, _values(r)))
        )
        courts = parse("court", lambda r: frozenset(map(normalize_court, _values(r))))
        kinds = frozenset(v.lower().replace("-", "_") for v in _values(f.source_type))
        if bad := sorted(kinds - set(AUTHORITY_TYPES)):
            raise SettingsError(
                f"{_named('source_type')}={','.join(bad)}: use {', '.join(AUTHORITY_TYPES)}"
            )
        after = parse("after", lambda r: parse_date(r) if r else None)
        before = parse("before", lambda r: parse_date(r, end=True) if r else None)
        if after and before and after > before:
            raise SettingsError(
                f"FILTER_AFTER={f.after.strip()} is later than FILTER_BEFORE={f.before.strip()} "
                "(--after, --before): no passage could match"
            )
        return cls(jurisdictions, courts, kinds, after, before)

    def __bool__(self) -> bool:
        return any((self.jurisdictions, self.courts, self.source_types, self.after, self.before))

    def admits(self, pid: str, source: str, meta: Mapping[str, Any]) -> bool:
        """Whether the passage ``pid`` (its source and stored metadata) is inside the filter."""
        a = attributes(pid, source, meta)
        if self.jurisdictions and a["jurisdiction"] not in self.jurisdictions:
            return False
        if self.courts and a["court"] not in self.courts:
            return False
        if self.source_types and a["authority_type"] not in self.source_types:
            return False
        date = a["date_int"]
        if (self.after or self.before) and date is None:
            return False
        return not (self.after and date < self.after or self.before and date > self.before)

    def describe(self) -> str:
        """One line for the CLI and the run metrics ("" for no filter)."""
        sets = (
            ("jurisdiction", self.jurisdictions),
            ("court", self.courts),
            ("source type", self.source_types),
        )
        parts = [f"{name} {', '.join(sorted(values))}" for name, values in sets if values]
        for name, d in (("after", self.after), ("before", self.before)):
            parts += [f"{name} {d // 10000}-{d // 100 % 100:02d}-{d % 100:02d}"] if d else []
        return "; ".join(parts)


@functools.lru_cache(maxsize=32)
def passage_filter(settings: Settings) -> PassageFilter:
    """The filter the settings ask for (settings are frozen and hashable, so it is built once)."""
    return PassageFilter.from_settings(settings)


def add_arguments(parser: Any) -> None:
    """The filter flags of an entry point (argparse): each sets its FILTER_* setting."""
    group = parser.add_argument_group("passage filters (every search returns only what they admit)")
    group.add_argument(
        "--jurisdiction", help="US (federal) or a state: TX, Texas (comma-separated)"
    )
    group.add_argument("--court", help="courts-db ids: scotus, ca9, tex (comma-separated)")
    group.add_argument("--source-type", help=f"authority types: {', '.join(AUTHORITY_TYPES)}")
    group.add_argument("--after", help="only passages dated on or after YYYY[-MM[-DD]]")
    group.add_argument("--before", help="only passages dated on or before YYYY[-MM[-DD]]")


def overrides(args: Any) -> dict[str, str | None]:
    """The settings the filter flags of ``args`` set (None: not given)."""
    names = ("jurisdiction", "court", "source_type", "after", "before")
    return {f"filter_{n}": getattr(args, n) for n in names}
